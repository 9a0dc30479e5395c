"""``python -m course_utils <command>``: the command line lives in ``course_utils.kit.cli``."""

import sys

from .kit.cli import main

if __name__ == "__main__":
    sys.exit(main())
