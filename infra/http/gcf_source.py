"""Stage the source folder for Google Cloud Functions, then deploy it with gcloud.

    python infra/http/gcf_source.py build/gcf [--requirements requirements.txt]
    gcloud functions deploy fnmap --gen2 --runtime=python311 --region=us-central1 \\
      --source=build/gcf --entry-point=invoke --trigger-http --allow-unauthenticated \\
      --memory=1Gi --timeout=540s --concurrency=1 --max-instances=100 \\
      --set-env-vars=FNMAP_SECRET=$FNMAP_SECRET,AWS_ACCESS_KEY_ID=...,AWS_SECRET_ACCESS_KEY=...

The folder holds ``main.py`` (``handlers/gcf.py``), fnmap, handlers and the
client's cloudpickle, and a ``requirements.txt``.  ``--runtime`` must be the
client's Python (python311 for 3.11).  See docs/deploy.md, "HTTP function hosts".
"""

import argparse
import sys

from fnmap.deploy.package import stage_gcf_source


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python infra/http/gcf_source.py", description=__doc__.split("\n\n")[0])
    p.add_argument("dest", help="a new or empty folder")
    p.add_argument("--requirements", help="requirements.txt of what your functions import")
    args = p.parse_args(argv)
    print(stage_gcf_source(args.dest, args.requirements))
    return 0


if __name__ == "__main__":
    sys.exit(main())
