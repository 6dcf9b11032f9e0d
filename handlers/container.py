"""Container entrypoint for GPU jobs: ``python -m handlers.container STORE_URL PREFIX``.

One child of an AWS Batch array job (or of a Kubernetes indexed Job) reads its
index from the platform, its signed request from storage, and runs it through
the shared worker routine.  The exit status tells the platform what happened:
see the ``EXIT_*`` codes in :mod:`fnmap.runtime.container`.
"""

from __future__ import annotations

import os
import sys

from fnmap.runtime import container, worker
from fnmap.runtime.signing import secret_from_env
from fnmap.storage import open_store


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m handlers.container STORE_URL REQUEST_PREFIX", file=sys.stderr)
        return container.EXIT_REJECTED
    store_url, prefix = args
    try:
        index = container.array_index(os.environ)
        data = open_store(store_url).get(container.request_key(prefix, index))
    except ValueError as e:
        print(f"fnmap: {e}", file=sys.stderr)
        return container.EXIT_REJECTED
    except Exception as e:  # storage unreachable or the request missing: a platform error
        print(
            f"fnmap: cannot read request {index} under {store_url} {prefix}: {e!r}", file=sys.stderr
        )
        return container.EXIT_PLATFORM
    try:
        signature, body = container.unpack_request(data)
    except ValueError as e:
        print(f"fnmap: stored request {index} is malformed: {e}", file=sys.stderr)
        return container.EXIT_REJECTED
    code, message = container.exit_status(*worker.handle(body, signature, secret_from_env()))
    print(message, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
