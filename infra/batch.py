"""Deploy or destroy the AWS Batch resources of the ``batch`` backend (GPU container jobs).

    python infra/batch.py deploy --image ACCOUNT.dkr.ecr.REGION.amazonaws.com/fnmap-gpu:latest
    python infra/batch.py destroy

The same as ``fnmap deploy batch ...``; ``--help`` lists every option.  Build
and push the image first from ``infra/Dockerfile.gpu``.  On an empty account it
also makes the IAM roles, instance profile and bucket it needs (tagged
``fnmap:batch-deployment=NAME``); ``destroy`` removes those and nothing else.
"""

import sys

from fnmap.deploy.batch_cli import main

if __name__ == "__main__":
    sys.exit(main())
