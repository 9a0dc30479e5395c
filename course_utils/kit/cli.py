"""Command line: ``python -m course_utils <command>`` (``course_utils/__main__.py`` calls ``main``).

Commands:
  doctor [--fast]     check this machine can run the course (exit 1 on problems)
  env                 print the environment report
  data verify         check every shipped file in data/ against its sha256
  data rebuild        regenerate data/tiny_corpus.txt from Python's own docs
  serve [options]     serve the tiny GPT (and MiniLM embeddings) over HTTP on 127.0.0.1
  workshop-check      doctor + every notebook in quick mode offline; READY or NOT READY
  report [--run]      headline results beside the reference machine's (Markdown + HTML)
  stamp               write measured minutes and "last passed" into README's notebook table
  cpu [--probe]       the CPU class and instruction sets the course's results depend on
  cpu --profile avx2 -- CMD   run CMD with torch, FBGEMM and Inductor capped to AVX2 (oneDNN, ONNX Runtime see the real CPU)
  progress [--file F ...]     exercises passed: your record, or one row per learner for several files
  answers [NOTEBOOK] [EXERCISE]   list the exercises, or print their reference solutions
  verdicts A.ipynb B.ipynb   the verdicts that differ between two executed runs (or two folders of them)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _doctor_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Return ``parser`` with the doctor's options added (the full parser's and ``_doctor``'s own)."""
    parser.add_argument("--fast", action="store_true", help="skip the real torch.compile probe")
    return parser


def _doctor(argv: Sequence[str]) -> int:
    """Run the doctor on its own parser: the full one imports the server's settings, and the doctor
    must answer on any Python, with nothing installed (see ``course_utils.kit.doctor``)."""
    parser = _doctor_arguments(argparse.ArgumentParser(prog="python -m course_utils doctor",
                                                       description="check this machine can run the course"))
    args = parser.parse_args(argv)
    from . import doctor

    return doctor.main(["--fast"] if args.fast else [])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m course_utils",
                                     description="Helpers for the PyTorch 2 course.")
    sub = parser.add_subparsers(dest="command", required=True)
    _doctor_arguments(sub.add_parser("doctor", help="check this machine can run the course"))
    sub.add_parser("env", help="print the environment report")
    data = sub.add_parser("data", help="check or rebuild the shipped data files")
    data.add_argument("action", choices=["verify", "rebuild"])
    serve = sub.add_parser("serve", help="serve the tiny GPT over HTTP (streaming, batching, metrics)")
    from ..serving.server.settings import add_cli_arguments

    add_cli_arguments(serve)
    # These parse their own options (python -m course_utils <command> --help).
    for name, text in (("workshop-check", "can this machine run the workshop?"),
                       ("report", "build the results report"),
                       ("stamp", "stamp README's notebook table from a run summary"),
                       ("cpu", "CPU class, or run a command under a CPU profile"),
                       ("progress", "which exercises are passed (one learner, or a class's files)"),
                       ("answers", "list the exercises or print their reference solutions"),
                       ("verdicts", "list the printed verdicts that differ between two runs of a notebook")):
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        return _doctor(argv[1:])
    args, rest = _parser().parse_known_args(argv)
    delegated = {"workshop-check": "course_utils.kit.workshop", "report": "course_utils.kit.report",
                 "stamp": "course_utils.kit.stamp", "cpu": "course_utils.kit.cpu_profiles",
                 "progress": "course_utils.kit.progress_report", "answers": "course_utils.kit.answers",
                 "verdicts": "course_utils.kit.verdicts"}
    if args.command in delegated:
        import importlib

        module = importlib.import_module(delegated[args.command])
        return module.main(rest)
    if rest:
        _parser().error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "env":
        from .env import format_report

        print(format_report())
        return 0
    if args.command == "serve":
        from ..serving.server.runner import serve
        from ..serving.server.settings import settings_from_args

        try:
            settings = settings_from_args(args)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return serve(settings)
    from ..data import DataFileError, shipped_files, verify
    from ..data.text import rebuild_corpus

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
