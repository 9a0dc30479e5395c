"""Can a classroom install the course with no internet? Build a wheelhouse once, install from it offline.

A *wheelhouse* is one folder holding every distribution the course installs (the pinned set in
``constraints.txt``, the build backend the course's own editable install needs, and pip), with
``manifest.json`` listing each file's size and sha256 and the Python and platform it was built for.
Copy the folder to a USB stick; on each laptop ``make setup WHEELHOUSE=/media/stick/wheelhouse`` (or
``make lab``/``make test`` with the same variable) checks it, then installs with ``pip --no-index``:
pip never looks at an index, so nothing is downloaded and a missing wheel is an error naming the
package at once, never a hang on a dead network.

What ``check`` trusts is the manifest, and only what it lists: a distribution file in the folder
that the manifest does not name, a name that is not a plain file name in the folder, a malformed
entry, or a wheelhouse built for another Python or platform is refused. ``check --requirements
FILE`` writes the verified set as a pip requirements file with one ``--hash=sha256:...`` per file,
and the install runs pip in hash-checking mode on it (``--require-hashes``), so pip checks every
file again as it installs it: a wheel changed after the check is refused, not installed. The course
itself is installed afterwards with ``--no-index --no-build-isolation`` and no folder to read, so it
can only use what the hashed step installed. Limits: the manifest is the root of trust (whoever can
rewrite the files and the manifest together can change both); sdists, if any, are built with build
tools pip takes from the folder without hash checks (pip's hash-checking mode does not cover build
dependencies); the Python check compares the interpreter tag (``cp311``), ``sys.platform`` and the
CPU architecture, not the C library or the macOS version, which pip still judges from the wheel tags.

Commands (``python -m course_utils.kit.wheelhouse ...``; standard library only, so the machine
that builds the wheelhouse needs no course environment):

- ``build [--dest DIR] [--platform TAG --python-version X.Y]``: download everything into DIR
  (default ``build/wheelhouse``), write the manifest, print the size. The default is this
  machine's OS, CPU architecture and Python; for learners on another platform, pass pip's
  ``--platform`` (e.g. ``macosx_11_0_arm64``, ``win_amd64``) and ``--python-version``: pip then
  takes wheels only (``--only-binary=:all:``) and resolves markers for that platform.
- ``check DIR [--requirements FILE] [--any-target]``: every listed file matches its checksum, no
  unlisted distribution file is there, every pinned distribution is there, and the wheelhouse was
  built for this Python and platform (``--any-target``: checksums only, for a wheelhouse made for
  other laptops); exit status 1 with the names otherwise. With ``--requirements``, write the hashed
  requirements file when all is well.
- ``install DIR [--venv PATH] [--netns]``: build a fresh virtual environment from DIR alone (in an
  empty network namespace with ``--netns``, Linux), time it, and record
  ``workshop.wheelhouse_install_s`` and ``workshop.wheelhouse_mb`` when ``COURSE_RESULTS`` is set.

Manifests written before the target was recorded (no ``target`` key) are still read: their
``platform`` and ``python`` fields give the same information.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform as _platform
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
EXTRA_REQUIREMENTS = ("pip>=24", "setuptools>=70.1")  # 70.1: editable builds without the `wheel` package
#: The file name endings pip reads as distributions in a ``--find-links`` folder (wheels and sdists).
ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tlz", ".tar.lz",
            ".tar.lzma")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TAG = re.compile(r"^(macosx|manylinux|musllinux|linux|win)\d*((?:_\d+)*)_(.+)$")
_OS = {"macosx": "darwin", "manylinux": "linux", "musllinux": "linux", "linux": "linux", "win": "win32"}
_SAME_MACHINE = {"amd64": "x86_64", "x64": "x86_64", "aarch64": "arm64"}


class WheelhouseError(RuntimeError):
    """The wheelhouse is missing, incomplete or damaged; the message says what and how to fix it."""


def normalise(name: str) -> str:
    """Return a distribution name in its normal form (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(constraints: Path) -> dict[str, str]:
    """Return {normalised name: version} of every ``name==version`` line in a constraints file.

    Raises ``WheelhouseError`` when the file is missing or not UTF-8 text.
    """
    try:
        text = constraints.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise WheelhouseError(f"cannot read the constraints file {constraints} ({err})") from None
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalise(name)] = version.strip()
    return pins


def is_archive(filename: str) -> bool:
    """Return True when pip would read a file of this name in a ``--find-links`` folder as a distribution."""
    return filename.lower().endswith(ARCHIVES)


def distribution_of(filename: str) -> tuple[str, str] | None:
    """Return (normalised name, version) of a wheel or sdist file name, or None for other files."""
    match = (re.match(r"^([^-]+)-(\d[^-]*)-.+\.whl$", filename) if filename.endswith(".whl")
             else re.match(r"^(.+?)-(\d[^-]*)\.(tar\.gz|zip)$", filename))
    return (normalise(match.group(1)), match.group(2)) if match else None


def target_here() -> dict[str, str]:
    """Return the Python and platform this interpreter installs for, in the manifest's ``target`` form."""
    implementation = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    return {"python_tag": "{}{}{}".format(implementation, *sys.version_info[:2]),
            "platform_tag": re.sub(r"[-.]", "_", sysconfig.get_platform()),
            "sys_platform": sys.platform, "machine": _platform.machine().lower()}


def target_of(platform_tag: str, python_version: str) -> dict[str, str]:
    """Return the ``target`` of a wheelhouse built for pip's ``--platform``/``--python-version`` (CPython).

    Takes pip's tags (``manylinux_2_17_x86_64``, ``macosx_11_0_arm64``, ``win_amd64``) and
    ``sysconfig`` names (``linux-x86_64``); raises ``WheelhouseError`` for anything else.
    """
    tag = re.sub(r"[-.]", "_", platform_tag)
    match = _TAG.match("win_x86" if tag == "win32" else tag)
    version = re.fullmatch(r"(\d)\.?(\d+)", python_version.strip())
    if not match or not version:
        raise WheelhouseError(f"unknown platform tag or Python version ({platform_tag!r}, {python_version!r}): "
                              "give a pip platform tag such as manylinux_2_17_x86_64 and a version like 3.11")
    return {"python_tag": "cp{}{}".format(*version.groups()), "platform_tag": tag,
            "sys_platform": _OS[match.group(1)], "machine": match.group(3).lower()}


def _describe(target: dict[str, str]) -> str:
    return f"{target['python_tag']} on {target['sys_platform']} {target['machine']}"


def target_problem(manifest: dict) -> str | None:
    """Return why this machine cannot install from a wheelhouse with this manifest, or None when it can."""
    built = manifest.get("target") or target_of(str(manifest.get("platform", "")), str(manifest.get("python", "")))
    here = target_here()
    machines = {_SAME_MACHINE.get(target["machine"], target["machine"]) for target in (built, here)}
    same_machine = len(machines) == 1 or built["machine"] == "universal2"  # macOS wheels for both CPUs
    if built["python_tag"] == here["python_tag"] and built["sys_platform"] == here["sys_platform"] and same_machine:
        return None
    version = "{}.{}".format(*sys.version_info[:2])
    return (f"built for {_describe(built)}, but this machine runs {_describe(here)}: build one for this machine "
            f"(`make wheelhouse` here, or `build --platform {here['platform_tag']} --python-version {version}` "
            f"elsewhere), or use a Python that matches")


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
    """Return the manifest of ``folder`` (every distribution file, its size and sha256), also written to it.

    ``platform`` and ``python_version`` are what it was built for; this machine's, or pip's tags.
    """
    files = [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and distribution_of(p.name)]
    native = platform == sysconfig.get_platform() and python_version == "{}.{}".format(*sys.version_info[:2])
    manifest = {
        "format": 2,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "platform": platform,
        "python": python_version,
        "target": target_here() if native else target_of(platform, python_version),
        "constraints_sha256": sha256(constraints),
        "total_mb": round(sum(f["bytes"] for f in files) / 1e6, 1),
        "files": files,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def _entry_error(entry: object, seen: set[str]) -> str | None:
    """Return what is wrong with one manifest entry, or None when it is well formed."""
    if not isinstance(entry, dict):
        return f"is {type(entry).__name__}, not an object with name, bytes and sha256"
    name = entry.get("name")
    if not isinstance(name, str) or Path(name).name != name or "\\" in name or not distribution_of(name):
        return f"names {name!r}, which is not a distribution file name inside the folder"
    if name in seen:
        return f"lists {name} a second time"
    size = entry.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"({name}) has no size in bytes (got {size!r})"
    if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
        return f"({name}) has no sha256 of 64 hex digits (got {entry.get('sha256')!r})"
    return None


def read_manifest(folder: Path) -> dict:
    """Return the folder's manifest once it is well formed; raise ``WheelhouseError`` (one line) otherwise.

    Well formed: a JSON object whose ``files`` is a non-empty list of entries, each a plain
    distribution file name inside the folder (no path, no ``..``), listed once, with an integer
    size and a 64-digit hex sha256; and, if present, a ``target`` object naming the Python tag, ``sys.platform`` and machine.
    """
    if not folder.is_dir():
        raise WheelhouseError(f"no wheelhouse at {folder}: build one with `make wheelhouse` (needs the network "
                              "once), or point WHEELHOUSE at the folder you copied")
    where, fix = folder / MANIFEST, "rebuild the wheelhouse with `make wheelhouse`"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise WheelhouseError(f"{where} is missing or damaged ({err}); {fix}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list) or not files:
        raise WheelhouseError(f"{where} is missing or damaged (no list of files); {fix}")
    seen: set[str] = set()
    for number, entry in enumerate(files, 1):
        error = _entry_error(entry, seen)
        if error:
            raise WheelhouseError(f"{where}: entry {number} {error}; {fix}")
        seen.add(entry["name"])
    target = manifest.get("target")
    if target is not None and not (isinstance(target, dict) and all(isinstance(target.get(k), str) for k in
                                                                    ("python_tag", "sys_platform", "machine"))):
        raise WheelhouseError(f"{where}: its target is not an object naming the Python and platform; {fix}")
    return manifest


def problems(folder: Path, constraints: Path, any_target: bool = False) -> list[str]:
    """Return what is wrong with a wheelhouse (empty when it is complete, undamaged and for this machine).

    Every manifest file must be present with its checksum, no other distribution file may be in
    the folder (pip would read it), and, unless ``any_target``, the wheelhouse must be built for
    this Python and platform and hold every distribution pinned in ``constraints`` at its pinned
    version (for other platforms pip's markers decide what is needed, and pip names anything missing).
    Raises ``WheelhouseError`` when the folder or its manifest is missing or malformed.
    """
    manifest = read_manifest(folder)
    found = []
    listed = {entry["name"] for entry in manifest["files"]}
    for entry in manifest["files"]:
        path = folder / entry["name"]
        if path.is_symlink() or not path.is_file():
            found.append(f"{path.name}: listed in the manifest but missing (or not a plain file)")
        elif path.stat().st_size != entry["bytes"] or sha256(path) != entry["sha256"]:
            found.append(f"{path.name}: damaged (its checksum differs from the manifest); copy it again")
    for path in sorted(folder.iterdir()):
        if is_archive(path.name) and path.name not in listed:
            found.append(f"{path.name}: in the folder but not in the manifest, and pip would read it; remove it "
                         "or rebuild the wheelhouse")
    versions: dict[str, set[str]] = {}
    for name, version in map(distribution_of, listed):
        versions.setdefault(name, set()).add(version)
    found += [f"{name}: several versions listed ({', '.join(sorted(v))}); rebuild the wheelhouse into an empty folder"
              for name, v in sorted(versions.items()) if len(v) > 1]
    if not any_target:
        mismatch = target_problem(manifest)
        if mismatch:
            return [*found, mismatch]
        for name, version in pinned(constraints).items():
            if version not in versions.get(name, ()):
                found.append(f"{name}=={version}: pinned in {constraints.name} but not in the wheelhouse")
    return found


def hashed_requirements(manifest: dict) -> str:
    """Return a pip requirements file pinning every distribution in ``manifest`` to its sha256 (for ``--require-hashes``)."""
    hashes: dict[tuple[str, str], list[str]] = {}
    for entry in manifest["files"]:
        hashes.setdefault(distribution_of(entry["name"]), []).append(entry["sha256"])
    lines = [f"{name}=={version} " + " ".join(f"--hash=sha256:{digest}" for digest in digests)
             for (name, version), digests in sorted(hashes.items())]
    return "# written by `python -m course_utils.kit.wheelhouse check`: install with pip --require-hashes\n" + \
        "\n".join(lines) + "\n"


def pip_source(folder: Path) -> list[str]:
    """Return the pip options that install from ``folder`` and nothing else."""
    return ["--no-index", "--find-links", str(folder.resolve())]


def pip_verified(folder: Path, requirements: Path) -> list[str]:
    """Return the pip options that install exactly the hashed ``requirements`` from ``folder`` alone."""
    return [*pip_source(folder), "--require-hashes", "-r", str(requirements)]


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

    The same steps as ``make setup WHEELHOUSE=...``: the verified set with pip checking each hash,
    then the course itself with nothing to fetch from. Raises ``WheelhouseError`` when the
    wheelhouse is incomplete (before pip runs) or the network namespace was asked for but cannot
    be made here.
    """
    bad = problems(folder, constraints)
    if bad:
        raise WheelhouseError("the wheelhouse is incomplete:\n  " + "\n  ".join(bad))
    requirements = hashed_requirements(read_manifest(folder))
    prefix: list[str] = []
    if use_netns:
        from . import netns

        wrapped, why = netns.wrap(python)
        if wrapped is None:
            raise WheelhouseError(f"cannot remove the network here: {why}")
        prefix = wrapped  # runs each command below in the namespace, loopback up
    vpy = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    hashed = venv / "wheelhouse-requirements.txt"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    env.pop("PIP_CONSTRAINT", None)
    start = time.perf_counter()
    subprocess.run([*prefix, python, "-m", "venv", str(venv)], check=True, cwd=REPO_ROOT, env=env)
    hashed.parent.mkdir(parents=True, exist_ok=True)
    hashed.write_text(requirements, encoding="utf-8")
    for step in ([vpy, "-m", "pip", "install", "--quiet", *pip_verified(folder, hashed)],
                 [vpy, "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation", "-c",
                  str(constraints), "-e", f"{REPO_ROOT}[dev]"]):
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
    c = sub.add_parser("check", help="verify checksums, that nothing else is there and every pin is present")
    c.add_argument("folder", type=Path)
    c.add_argument("--requirements", type=Path, default=None,
                   help="when all is well, write the hashed requirements file that pip --require-hashes installs")
    c.add_argument("--any-target", action="store_true",
                   help="a wheelhouse for another Python or platform: checksums and unlisted files only")
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
            bad = problems(args.folder, args.constraints, any_target=args.any_target)
            for line in bad:
                print(f"FAIL  {line}")
            print("wheelhouse complete" if not bad else f"wheelhouse NOT complete ({len(bad)} problems): "
                  "rebuild it with `make wheelhouse`")
            if args.requirements and not bad:
                args.requirements.parent.mkdir(parents=True, exist_ok=True)
                args.requirements.write_text(hashed_requirements(read_manifest(args.folder)), encoding="utf-8")
            return 1 if bad else 0
        seconds = install(args.folder, args.venv, args.constraints, use_netns=args.netns)
        megabytes = read_manifest(args.folder)["total_mb"]
        print(f"installed from the wheelhouse ({megabytes:.0f} MB) in {seconds:.0f} s, "
              f"{'network namespace' if args.netns else 'no index'}: {args.venv}")
        if os.environ.get("COURSE_RESULTS"):
            _record(args.venv, seconds, megabytes, args.netns)
        return 0
    except (WheelhouseError, OSError) as err:
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
