"""`python -m nostall ...`: the `nostall` command."""

import sys

from nostall.user_code import working_directory_last

# `python -m` put the working directory first: moved last, as the `nostall` command has it.
working_directory_last()

from nostall.cli import main  # noqa: E402

sys.exit(main())
