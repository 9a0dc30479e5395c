"""Command line: ``python -m course_utils <command>``.

Commands:
  doctor [--fast]     check this machine can run the course (exit 1 on problems)
  env                 print the environment report
  data verify         check every shipped file in data/ against its sha256
  data rebuild        regenerate data/tiny_corpus.txt from Python's own docs
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m course_utils",
                                     description="Helpers for the PyTorch 2 course.")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check this machine can run the course")
    doctor.add_argument("--fast", action="store_true", help="skip the real torch.compile probe")
    sub.add_parser("env", help="print the environment report")
    data = sub.add_parser("data", help="check or rebuild the shipped data files")
    data.add_argument("action", choices=["verify", "rebuild"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status."""
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        from . import doctor

        return doctor.main(["--fast"] if args.fast else [])
    if args.command == "env":
        from .env import format_report

        print(format_report())
        return 0
    from .data import DataFileError, shipped_files, verify
    from .data.text import rebuild_corpus

    try:
        if args.action == "rebuild":
            print(rebuild_corpus())
            return 0
        for name in shipped_files():
            verify(name)
            print(f"ok    data/{name}")
        return 0
    except DataFileError as err:
        print(f"FAIL  {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
