"""``fnmap emulator --aws``: the AWS path with no AWS account, from one command.

The emulator already serves Lambda's Invoke API (running the deployment package under AWS's
runtime interface client) and Batch's API.  This adds an S3 server on loopback (moto's, a
maintained S3 implementation) with a bucket, points the emulator's own Lambda environments at it,
and prints the ``export`` lines a shell needs so that ``fnmap.map(..., backend="aws")`` goes
boto3 -> the emulator's Lambda API -> the handler -> S3 and back, exactly as in the cloud.

The other AWS services (IAM, STS, CloudWatch Logs) go to moto too (``AWS_ENDPOINT_URL``), so
``fnmap deploy aws deploy|env`` runs against it; Batch goes to the emulator.  The export lines
hold the signing secret: ``--env-file`` is written with mode 0600, whole or not at all, and a folder
made for it is 0700 with a ``.gitignore`` of ``*`` (:func:`private_folder`), so git never picks it up.
``--detach`` (:func:`detach`) starts the emulator in the background and returns once the file is
written, so ``source`` on the next line of a script finds it; ``kill $OFFLINE_EMULATOR_PID`` stops it.
Its output goes to ``PATH.log`` (0600 too), without the export lines: the secrets are in one file only.

A shell that sourced an earlier emulator's file still exports that emulator's endpoints; the
emulator replaces every endpoint variable in its own environment (:func:`own_endpoints`), so its
Lambda environments reach this emulator and its S3, never the old, stopped ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ..errors import ConfigError
from ..runtime.signing import SECRET_ENV, new_secret
from .sigv4 import ACCESS_KEY_ENV, SECRET_KEY_ENV, new_credentials

BUCKET = "fnmap-offline"
#: S3's limit on one PutObject (5 GiB): the bodies the offline S3 takes, as moto's own server took any.
S3_PUT_LIMIT = 5 << 30
REGION = "us-east-1"


def offline_credentials() -> dict:
    """The AWS credentials of the rehearsal: the emulator's (``FNMAP_EMULATOR_ACCESS_KEY_ID`` and
    ``FNMAP_EMULATOR_SECRET_ACCESS_KEY`` when set, else fresh ones).  boto3 signs every request with
    them; the emulator's Lambda and Batch APIs accept only these (moto's S3 takes any)."""
    key_id, secret = os.environ.get(ACCESS_KEY_ENV), os.environ.get(SECRET_KEY_ENV)
    if not (key_id and secret):
        key_id, secret = new_credentials()
    return {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION}


class OfflineAws:
    """An S3 server with the job bucket, and the environment the emulator and its clients need."""

    def __init__(self, host: str = "127.0.0.1"):
        import boto3

        self._server = MotoServer(host)
        self.s3_url = self._server.url
        self.credentials = offline_credentials()
        os.environ.update(self.credentials)
        os.environ.update({ACCESS_KEY_ENV: self.credentials["AWS_ACCESS_KEY_ID"],
                           SECRET_KEY_ENV: self.credentials["AWS_SECRET_ACCESS_KEY"]})
        own_endpoints(self.s3_url)
        os.environ.setdefault(SECRET_ENV, new_secret())
        boto3.client("s3", endpoint_url=self.s3_url, region_name=REGION).create_bucket(Bucket=BUCKET)

    def exports(self, emulator_url: str) -> list[str]:
        """The shell lines that send a client's jobs through this emulator and its S3."""
        settings = {
            "FNMAP_BACKEND": "aws",
            "FNMAP_STORAGE": f"s3://{BUCKET}/fnmap",
            SECRET_ENV: os.environ[SECRET_ENV],
            "AWS_ENDPOINT_URL_LAMBDA": emulator_url,
            "AWS_ENDPOINT_URL_S3": self.s3_url,
            "AWS_ENDPOINT_URL_BATCH": emulator_url,
            "AWS_ENDPOINT_URL": self.s3_url,  # IAM, STS, Logs (fnmap deploy aws): moto serves them all
            **self.credentials,
            "OFFLINE_EMULATOR_PID": str(os.getpid()),  # kill $OFFLINE_EMULATOR_PID stops it
        }
        return [f"export {name}={value}" for name, value in settings.items()]

    def announcer(self, env_file: str | None, detached: bool = False):
        """The emulator's ``on_listening`` hook: print the exports (and write them to ``env_file``).

        ``detached``: started by ``--detach``, whose output is a log file: the exports go to
        ``env_file`` only (``--detach`` prints them on the terminal it returns to)."""

        def announce(emulator_url: str) -> None:
            lines = self.exports(emulator_url)
            if env_file:
                write_private(env_file, "\n".join(lines) + "\n")
            if not detached:
                print("\n".join(lines), flush=True)
                for warning in unignored_warnings(env_file):
                    print(warning, flush=True)
            where = f"source {env_file} (mode 0600)" if detached else "run the lines above in a shell"
            print(f"# the AWS path offline: Lambda and Batch at {emulator_url}, S3 at {self.s3_url} "
                  f"(bucket {BUCKET}); {where}", flush=True)

        return announce

    def stop(self) -> None:
        self._server.close()


class MotoServer:
    """moto's AWS services (S3, IAM, STS, Logs) on ``host``, served by the emulator's HTTP server.

    moto's own server (werkzeug's development server, and its dispatcher finding the service of every
    request anew under one lock) cost about 2.3 ms of CPU per S3 request, more than the call it
    stores; here a request signed for S3 (SigV4's credential scope names the service) goes straight
    to moto's S3 application, everything else through moto's dispatcher, on keep-alive connections
    with Nagle off: about 0.9 ms.  moto still parses, stores and answers every request."""

    def __init__(self, host: str = "127.0.0.1"):
        try:
            from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        except ImportError as e:
            raise ConfigError("fnmap emulator --aws serves S3 with moto's server, which is not installed: "
                              "pip install 'fnmap[aws-offline]' (or moto[server])") from e
        import threading

        from .httpserver import WSGIServer

        self._dispatcher = DomainDispatcherApplication(create_backend_app)
        self._s3 = create_backend_app("s3")
        self._server = WSGIServer(self._app, host, 0, max_body=S3_PUT_LIMIT)
        self.url = f"http://{self._server.host}:{self._server.port}"
        threading.Thread(target=self._server.serve_forever, name="fnmap-offline-s3", daemon=True).start()

    def _app(self, environ, start_response):
        if _signed_for_s3(environ):
            return self._s3(environ, start_response)
        return self._dispatcher(environ, start_response)

    def close(self) -> None:
        self._server.close()


def _signed_for_s3(environ: dict) -> bool:
    """Whether a request is S3's own: its SigV4 credential scope (``KEY/DATE/REGION/SERVICE/aws4_request``)
    names ``s3``, and it is not S3 Control's (which moto's dispatcher tells by path or host)."""
    auth = environ.get("HTTP_AUTHORIZATION", "")
    if not auth.startswith("AWS4-HMAC-SHA256 Credential="):
        return False
    scope = auth[len("AWS4-HMAC-SHA256 Credential="):].split(",", 1)[0].split("/")
    return (len(scope) == 5 and scope[3] == "s3" and not environ.get("PATH_INFO", "").startswith("/v20180820/")
            and "s3-control" not in environ.get("HTTP_HOST", ""))


def own_endpoints(s3_url: str) -> None:
    """Point this process's environment (which the Lambda environments inherit) at this emulator's S3,
    whatever the shell exported: every ``AWS_ENDPOINT_URL*`` and ``FNMAP_S3_ENDPOINT_URL`` an earlier
    emulator's env file set names a server that is gone.  The Lambda and Batch endpoints are this
    emulator's own, set for its Lambda environments once it listens (:mod:`.lambda_api`); a session
    token belongs to other credentials than the ones :class:`OfflineAws` sets, so it goes too."""
    for name in [k for k in os.environ if k.startswith("AWS_ENDPOINT_URL")]:
        del os.environ[name]
    os.environ.pop("AWS_SESSION_TOKEN", None)
    # S3, and IAM, STS and Logs (moto serves them all), as the exports say.
    os.environ.update(AWS_ENDPOINT_URL_S3=s3_url, AWS_ENDPOINT_URL=s3_url, FNMAP_S3_ENDPOINT_URL=s3_url)


def private_folder(path: str) -> None:
    """Make the folder of ``path`` if it is missing: mode 0700, with a ``.gitignore`` of ``*`` (as
    pytest's cache folder has), so that the secrets written there never reach a repository."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(folder):
        return
    os.makedirs(folder, mode=0o700)
    with open(os.path.join(folder, ".gitignore"), "w") as f:
        f.write("# made by fnmap: what is here holds secrets (FNMAP_SECRET, AWS keys)\n*\n")


def unignored_warnings(env_file: str | None) -> list[str]:
    """A warning for each file the rehearsal writes (``env_file`` and its log) that is in a git work
    tree which does not ignore it: it holds the secret, one ``git add .`` from a repository."""
    if not env_file:
        return []
    folder = os.path.dirname(os.path.abspath(env_file))
    loose = []
    for path in (env_file, f"{env_file}.log"):
        try:
            done = subprocess.run(["git", "-C", folder, "check-ignore", "-q", "--", os.path.abspath(path)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return []  # no git here: nothing to warn about
        if done.returncode == 1:  # in a work tree, not ignored (128: not a work tree)
            loose.append(path)
    if not loose:
        return []
    return [f"# warning: git does not ignore {' and '.join(loose)}, which hold the secret: add them to .gitignore, "
            "or use --env-file .fnmap/offline.env (fnmap makes that folder with a .gitignore of its own)"]


def write_private(path: str, text: str) -> None:
    """Write ``text`` (it holds the secret) to ``path`` readable by its owner only (0600), atomically:
    a reader finds the whole file or none."""
    private_folder(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


#: Seconds ``--detach`` waits for the emulator to write its env file (moto and the emulator start).
DETACH_WAIT_SECONDS = 120.0


def detach(argv: list[str], env_file: str | None) -> int:
    """``fnmap emulator --aws --env-file F --detach``: run the emulator (``argv`` with ``--detached``
    for ``--detach``) in the background, in its own session, with its output in ``F.log`` (0600, no
    export lines); return once ``F`` is written (printing it), or fail with the emulator's own error."""
    if not env_file:
        raise SystemExit("fnmap emulator: --detach needs --env-file PATH (the file it returns once written)")
    if os.path.exists(env_file):
        os.unlink(env_file)  # a stale file from an earlier emulator must not count as ready
    private_folder(env_file)
    command = [sys.executable, "-m", "fnmap", "emulator", *["--detached" if a == "--detach" else a for a in argv]]
    # 0600 even if an earlier, laxer fnmap made it; emptied: this emulator's output only.
    fd = os.open(f"{env_file}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + DETACH_WAIT_SECONDS
    while not os.path.exists(env_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            with open(f"{env_file}.log", errors="replace") as log:
                tail = log.read()[-2000:].strip()
            raise SystemExit(f"fnmap emulator --detach: the emulator did not start ({tail or 'no output'})")
        time.sleep(0.1)
    with open(env_file) as f:
        print(f.read(), end="")
    print(f"# the emulator runs in the background (pid {proc.pid}, output in {env_file}.log); "
          "stop it with: kill $OFFLINE_EMULATOR_PID", flush=True)
    for warning in unignored_warnings(env_file):
        print(warning, flush=True)
    return 0
