"""``fnmap emulator --aws``: the AWS path with no AWS account, from one command.

The emulator already serves Lambda's Invoke API (running the deployment package under AWS's
runtime interface client) and Batch's API.  This adds an S3 server on loopback (moto's, a
maintained S3 implementation) with a bucket, points the emulator's own Lambda environments at it,
and prints the ``export`` lines a shell needs so that ``fnmap.map(..., backend="aws")`` goes
boto3 -> the emulator's Lambda API -> the handler -> S3 and back, exactly as in the cloud.
"""

from __future__ import annotations

import os

from ..errors import ConfigError
from ..runtime.signing import SECRET_ENV, new_secret
from .sigv4 import ACCESS_KEY_ENV, SECRET_KEY_ENV, new_credentials

BUCKET = "fnmap-offline"
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
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as e:
            raise ConfigError("fnmap emulator --aws serves S3 with moto's server, which is not installed: "
                              "pip install 'fnmap[aws-offline]' (or moto[server])") from e
        import logging

        import boto3

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
        self._server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
        self._server.start()
        s3_host, s3_port = self._server.get_host_and_port()
        self.s3_url = f"http://{s3_host}:{s3_port}"
        self.credentials = offline_credentials()
        os.environ.update(self.credentials)
        os.environ.update({ACCESS_KEY_ENV: self.credentials["AWS_ACCESS_KEY_ID"],
                           SECRET_KEY_ENV: self.credentials["AWS_SECRET_ACCESS_KEY"]})
        os.environ["AWS_ENDPOINT_URL_S3"] = self.s3_url  # the emulator's Lambda environments use it
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
            **self.credentials,
        }
        return [f"export {name}={value}" for name, value in settings.items()]

    def announcer(self, env_file: str | None):
        """The emulator's ``on_listening`` hook: print the exports (and write them to ``env_file``)."""

        def announce(emulator_url: str) -> None:
            lines = self.exports(emulator_url)
            if env_file:
                with open(env_file, "w") as f:
                    f.write("\n".join(lines) + "\n")
            print("\n".join(lines), flush=True)
            print(f"# the AWS path offline: Lambda and Batch at {emulator_url}, S3 at {self.s3_url} "
                  f"(bucket {BUCKET}); run the lines above in a shell", flush=True)

        return announce

    def stop(self) -> None:
        self._server.stop()
