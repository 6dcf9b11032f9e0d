"""Deploy, update or destroy fnmap on AWS Lambda (the ``aws`` backend): bucket, role, function, URL.

    python -m infra.aws deploy                  # or: python infra/aws.py deploy
    python -m infra.aws deploy --requirements requirements.txt --memory 2048
    python -m infra.aws update
    python -m infra.aws destroy

The same as ``fnmap deploy aws ...``; ``--help`` lists every option.  It prints
the FNMAP_* settings a client needs.  See docs/deploy.md, "Run on AWS".
"""

import sys

from fnmap.deploy.aws import main

if __name__ == "__main__":
    sys.exit(main())
