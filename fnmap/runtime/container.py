"""Container jobs (AWS Batch array jobs, Kubernetes indexed Jobs): how each child finds its call.

The client writes one signed request per child under a request prefix of the
job (``jobs/<job_id>/requests/<array>/``, spread over 16 sub-prefixes like
every per-call key), then submits one array job whose children all run the
same command, ``python -m handlers.container STORE_URL PREFIX``.  A child
takes its index from ``AWS_BATCH_JOB_ARRAY_INDEX`` (AWS Batch) or
``JOB_COMPLETION_INDEX`` (Kubernetes indexed Jobs); with neither set it is a
single, non-array job and runs index 0.

A child's exit status is how the platform learns what happened (AWS Batch
marks the child FAILED on a non-zero exit), so the codes below are part of the
protocol between ``handlers/container.py`` and the ``batch`` backend.  This
module is on the worker side: it imports nothing of the client.
"""

from __future__ import annotations

from collections.abc import Mapping

from .keys import batch_request_prefix, spread
from .wire import decode_header, decode_response, encode

#: Environment variables that carry a child's index, in the order they are looked up.
INDEX_VARIABLES = ("AWS_BATCH_JOB_ARRAY_INDEX", "JOB_COMPLETION_INDEX")
#: The command of the job definition; AWS Batch substitutes ``Ref::`` parameters per submission.
COMMAND = ["python", "-m", "handlers.container", "Ref::store", "Ref::prefix"]
#: AWS Batch's limit on the children of one array job.
MAX_ARRAY_SIZE = 10_000

EXIT_OK = 0
#: A platform error (storage unreachable, version mismatch, an uncaught error): worth a re-run.
EXIT_PLATFORM = 1
#: The call raised a user exception listed in ``retry_on`` with attempts left; nothing was committed
#: (sysexits' EX_TEMPFAIL).
EXIT_RETRY = 75
#: The request was refused (bad signature, malformed, no secret, bad index): re-running cannot help
#: (sysexits' EX_NOPERM).
EXIT_REJECTED = 77


def request_prefix(job_id: str, array_id: str) -> str:
    return batch_request_prefix(job_id, array_id)


def request_key(prefix: str, index: int) -> str:
    return f"{prefix}{spread(index)}/{index}"


def pack_request(signature: str, body: bytes) -> bytes:
    """A stored request: the signature in the envelope's header, the signed body as its payload."""
    return encode({"signature": signature}, body)


def unpack_request(data: bytes) -> tuple[str, bytes]:
    """Inverse of :func:`pack_request`; raises ValueError when malformed."""
    header, offset = decode_header(data)
    signature = header.get("signature")
    if not isinstance(signature, str):
        raise ValueError("stored request has no signature")
    return signature, bytes(memoryview(data)[offset:])


def array_index(environ: Mapping[str, str]) -> int:
    """The child's index; raises ValueError naming the variable when it is not a number >= 0."""
    for name in INDEX_VARIABLES:
        raw = environ.get(name)
        if raw not in (None, ""):
            try:
                index = int(raw)
            except ValueError:
                index = -1
            if index < 0:
                raise ValueError(f"{name}={raw!r} is not an array index (an integer >= 0)")
            return index
    return 0


def exit_status(status: int, answer: bytes) -> tuple[int, str]:
    """Map the worker's answer to the child's exit code and a one-line message for its log."""
    if status != 200:
        return (
            EXIT_REJECTED,
            f"fnmap: request refused ({status}): {answer.decode(errors='replace')}",
        )
    resp, _ = decode_response(answer)
    where = f"call {resp.call_id} of job {resp.job_id}, attempt {resp.attempt}"
    if not resp.ok:
        return EXIT_PLATFORM, f"fnmap: platform error ({resp.error_kind}) in {where}: {resp.error}"
    if resp.error_kind == "retry_on":
        return EXIT_RETRY, f"fnmap: {where} raised an exception listed in retry_on; not committed"
    state = "committed" if resp.committed else "already committed by another attempt"
    return EXIT_OK, f"fnmap: {where} done, result {state}"
