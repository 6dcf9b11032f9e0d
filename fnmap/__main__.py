import sys

from fnmap.cli import main

sys.exit(main())
