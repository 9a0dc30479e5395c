"""Can a classroom install the course with no internet? Build a wheelhouse once, install from it offline.

A *wheelhouse* is one folder holding every distribution the course installs (the pinned set in
``constraints.txt``, the build backend the course's own editable install needs, and pip), with
``manifest.json`` listing each file's size and sha256. Copy the folder to a USB stick; on each
laptop ``make setup WHEELHOUSE=/media/stick/wheelhouse`` (or ``make lab``/``make test`` with the same
variable) installs with ``pip --no-index``: pip never looks at an index, so nothing is downloaded
and a missing wheel is an error naming the package at once, never a hang on a dead network.

Commands (``python -m course_utils.kit.wheelhouse ...``; standard library only, so the machine
that builds the wheelhouse needs no course environment):

- ``build [--dest DIR] [--platform TAG --python-version X.Y]``: download everything into DIR
  (default ``build/wheelhouse``), write the manifest, print the size. The default is this
  machine's OS, CPU architecture and Python; for learners on another platform, pass pip's
  ``--platform`` (e.g. ``macosx_11_0_arm64``, ``win_amd64``) and ``--python-version``: pip then
  takes wheels only (``--only-binary=:all:``) and resolves markers for that platform.
- ``check DIR``: every file matches the manifest's checksum and every pinned distribution is
  there; exit status 1 with the names otherwise.
- ``install DIR [--venv PATH] [--netns]``: build a fresh virtual environment from DIR alone (in an
  empty network namespace with ``--netns``, Linux), time it, and record
  ``workshop.wheelhouse_install_s`` and ``workshop.wheelhouse_mb`` when ``COURSE_RESULTS`` is set.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

from .. import config  # standard library only, like this module

REPO_ROOT = config.REPO_ROOT
#: Where ``make wheelhouse`` puts the folder unless told otherwise.
DEFAULT_DEST = REPO_ROOT / "build" / "wheelhouse"
MANIFEST = "manifest.json"
#: Installed besides the pinned set: pip itself, and the course's build backend (pyproject's
#: ``[build-system]``), which an offline editable install must find in the folder.
EXTRA_REQUIREMENTS = ("pip>=24", "setuptools>=68")


class WheelhouseError(RuntimeError):
    """The wheelhouse is missing, incomplete or damaged; the message says what and how to fix it."""


def normalise(name: str) -> str:
    """Return a distribution name in its normal form (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(constraints: Path) -> dict[str, str]:
    """Return {normalised name: version} of every ``name==version`` line in a constraints file."""
    pins = {}
    for line in constraints.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalise(name)] = version.strip()
    return pins


def distribution_of(filename: str) -> tuple[str, str] | None:
    """Return (normalised name, version) of a wheel or sdist file name, or None for other files."""
    if filename.endswith(".whl"):
        name, version = filename[:-4].split("-")[:2]
        return normalise(name), version
    match = re.match(r"^(.+?)-(\d[^-]*)\.(tar\.gz|zip)$", filename)
    return (normalise(match.group(1)), match.group(2)) if match else None


def sha256(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB blocks.

    The same as ``course_utils.data.files.sha256_of``, written again because importing ``data``
    imports torch and this module must run without the course environment (a test ties the two).
    """
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, constraints: Path, platform: str, python_version: str) -> dict:
    """Return the manifest of ``folder`` (every distribution file, its size and sha256), also written to it."""
    files = [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and distribution_of(p.name)]
    manifest = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "platform": platform,
        "python": python_version,
        "constraints_sha256": sha256(constraints),
        "total_mb": round(sum(f["bytes"] for f in files) / 1e6, 1),
        "files": files,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def read_manifest(folder: Path) -> dict:
    """Return the folder's manifest; raise ``WheelhouseError`` when the folder or manifest is missing or unreadable."""
    if not folder.is_dir():
        raise WheelhouseError(f"no wheelhouse at {folder}: build one with `make wheelhouse` (needs the network "
                              "once), or point WHEELHOUSE at the folder you copied")
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, list):
            raise TypeError("files is not a list")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise WheelhouseError(f"{folder / MANIFEST} is missing or damaged ({err}); rebuild the wheelhouse "
                              "with `make wheelhouse`") from None
    return manifest


def problems(folder: Path, constraints: Path) -> list[str]:
    """Return what is wrong with a wheelhouse (empty when it is complete and undamaged).

    Every manifest file must be present with its checksum, and every distribution pinned in
    ``constraints`` must have a file at its pinned version, unless the wheelhouse was built for
    another platform, where pip's markers decide what is needed and pip names anything missing.
    """
    manifest = read_manifest(folder)
    found = []
    for entry in manifest["files"]:
        path = folder / str(entry.get("name", ""))
        if not path.is_file():
            found.append(f"{path.name}: listed in the manifest but missing")
        elif path.stat().st_size != entry.get("bytes") or sha256(path) != entry.get("sha256"):
            found.append(f"{path.name}: damaged (its checksum differs from the manifest); copy it again")
    if manifest.get("platform") == sysconfig.get_platform():
        have = {distribution_of(p.name) for p in folder.iterdir() if p.is_file()}
        for name, version in pinned(constraints).items():
            if (name, version) not in have:
                found.append(f"{name}=={version}: pinned in {constraints.name} but not in the wheelhouse")
    return found


def pip_source(folder: Path) -> list[str]:
    """Return the pip options that install from ``folder`` and nothing else."""
    return ["--no-index", "--find-links", str(folder.resolve())]


def build(dest: Path, constraints: Path, platform: str | None = None, python_version: str | None = None,
          python: str = sys.executable, env: dict[str, str] | None = None) -> dict:
    """Return the manifest after downloading every distribution the course installs into ``dest``.

    ``env`` is pip's environment (default: this process's).
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "--dest", str(dest), "-c", str(constraints),
           f"{REPO_ROOT}[dev]", *EXTRA_REQUIREMENTS]
    if platform or python_version:
        cmd += ["--only-binary=:all:"]
        cmd += ["--platform", platform] if platform else []
        cmd += ["--python-version", python_version] if python_version else []
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO_ROOT, env=env)
    # pip builds the course's own sdist while resolving it; the course installs from the checkout instead
    for stray in dest.glob("pytorch2[-_]course-*"):
        stray.unlink()
    return write_manifest(dest, constraints, platform or sysconfig.get_platform(),
                          python_version or "{}.{}".format(*sys.version_info[:2]))


def install(folder: Path, venv: Path, constraints: Path, use_netns: bool = False,
            python: str = sys.executable) -> float:
    """Return the seconds it took to build ``venv`` with the course installed from ``folder`` alone.

    Raises ``WheelhouseError`` when the wheelhouse is incomplete (before pip runs) or the
    network namespace was asked for but cannot be made here.
    """
    bad = problems(folder, constraints)
    if bad:
        raise WheelhouseError("the wheelhouse is incomplete:\n  " + "\n  ".join(bad))
    prefix: list[str] = []
    if use_netns:
        from . import netns

        wrapped, why = netns.wrap(python)
        if wrapped is None:
            raise WheelhouseError(f"cannot remove the network here: {why}")
        prefix = wrapped  # runs each command below in the namespace, loopback up
    vpy = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    steps = [
        [python, "-m", "venv", str(venv)],
        [vpy, "-m", "pip", "install", "--quiet", *pip_source(folder), "--upgrade", "pip>=24"],
        [vpy, "-m", "pip", "install", "--quiet", *pip_source(folder), "-c", str(constraints), "-e",
         f"{REPO_ROOT}[dev]"],
    ]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    env.pop("PIP_CONSTRAINT", None)
    start = time.perf_counter()
    for step in steps:
        subprocess.run([*prefix, *step], check=True, cwd=REPO_ROOT, env=env)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``build``, ``check`` or ``install`` and return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.kit.wheelhouse")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download every pinned distribution into one folder")
    b.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    b.add_argument("--platform", default=None, help="pip platform tag for another OS (e.g. macosx_11_0_arm64)")
    b.add_argument("--python-version", default=None, help="for another Python, e.g. 3.12")
    c = sub.add_parser("check", help="verify checksums and that every pin is present")
    c.add_argument("folder", type=Path)
    i = sub.add_parser("install", help="build a virtual environment from the wheelhouse alone, timed")
    i.add_argument("folder", type=Path)
    i.add_argument("--venv", type=Path, default=REPO_ROOT / "build" / "wheelhouse-venv")
    i.add_argument("--netns", action="store_true", help="in an empty network namespace (Linux)")
    for p in (b, c, i):
        p.add_argument("--constraints", type=Path, default=REPO_ROOT / "constraints.txt")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            manifest = build(args.dest, args.constraints, args.platform, args.python_version)
            print(f"wheelhouse: {len(manifest['files'])} files, {manifest['total_mb']:.0f} MB in {args.dest}")
            return 0
        if args.command == "check":
            bad = problems(args.folder, args.constraints)
            for line in bad:
                print(f"FAIL  {line}")
            print("wheelhouse complete" if not bad else f"wheelhouse NOT complete ({len(bad)} problems): "
                  "rebuild it with `make wheelhouse`")
            return 1 if bad else 0
        seconds = install(args.folder, args.venv, args.constraints, use_netns=args.netns)
        megabytes = read_manifest(args.folder)["total_mb"]
        print(f"installed from the wheelhouse ({megabytes:.0f} MB) in {seconds:.0f} s, "
              f"{'network namespace' if args.netns else 'no index'}: {args.venv}")
        if os.environ.get("COURSE_RESULTS"):
            _record(args.venv, seconds, megabytes, args.netns)
        return 0
    except WheelhouseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as err:
        print(f"error: {shlex.join(map(str, err.cmd))} failed with exit status {err.returncode}", file=sys.stderr)
        return 1


def _record(venv: Path, seconds: float, megabytes: float, use_netns: bool) -> None:
    """Record the two headline results with the new environment's Python (it has torch; this one may not)."""
    vpy = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    code = ("import sys; from course_utils import bench; "
            "bench.record('workshop.wheelhouse_install_s', float(sys.argv[1]), 's', netns=sys.argv[3] == '1'); "
            "bench.record('workshop.wheelhouse_mb', float(sys.argv[2]), 'MB')")
    subprocess.run([vpy, "-c", code, str(seconds), str(megabytes), "1" if use_netns else "0"], check=True,
                   cwd=REPO_ROOT)


if __name__ == "__main__":
    sys.exit(main())
