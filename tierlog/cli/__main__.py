"""`python -m tierlog.cli`: the same as the `tierlog` console script."""

import sys

from tierlog.cli.main import main

sys.exit(main())
