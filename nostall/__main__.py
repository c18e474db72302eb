"""`python -m nostall ...`: the `nostall` command."""

import sys

from nostall.cli import main

sys.exit(main())
