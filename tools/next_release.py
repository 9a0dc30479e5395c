"""Pick the newest torch family the registry offers inside the course's ranges (`make test-next`).

The course pins one tested set in constraints.txt. This tool answers the question a maintainer
asks every week: *which newer torch, torchvision and torchaudio could a learner get today, and does
the course still pass on them?* It reads the ranges pyproject.toml declares, asks the package
index (PyPI's JSON API) which releases exist, and picks the newest torch for which the whole family
is installable here, by these rules:

- a release counts only if it is final (no rc, dev or post-only pre-release), not yanked, admits
  this Python, and has a wheel this interpreter can install (its platform tags);
- torchvision 0.(N + 15) is built for torch 2.N and for nothing else (its compiled operators link
  one torch release; its metadata names only a floor), so a torch whose torchvision is not out yet
  is skipped, with the reason;
- torchaudio is taken as the newest release no newer than torch's own minor version (the tested
  set already pairs torchaudio 2.11.1 with torch 2.14.1: torchaudio's releases now trail torch's).

It writes a constraints file: constraints.txt with the family replaced by the picks and the pins
that follow torch's own build dropped (nvidia-*, triton, cuda-*), which pip then resolves for the
picked torch; everything else stays exactly as tested. The file is written only when its content
changes, so `make` rebuilds the environment only when the registry offers something new. What it
picked, and why it skipped newer releases, goes to standard error (and to ``--report`` as JSON).

Only ``main()`` touches the network (`make test-next`); the functions take the index's JSON as
data, so the unit tests (tests/test_next_release.py) run on canned answers.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from packaging.specifiers import SpecifierSet
    from packaging.tags import Tag, sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ModuleNotFoundError:  # a bare Python: the copy pip carries is enough
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.tags import Tag, sys_tags  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import InvalidWheelFilename, parse_wheel_filename  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
FAMILY = ("torch", "torchvision", "torchaudio")
#: PyPI's JSON API: ``{INDEX}/{name}/json`` lists every release with its files.
INDEX = "https://pypi.org/pypi"
#: Pins that follow torch's build rather than the course (as in tools/min_constraints.py).
FOLLOW_TORCH = re.compile(r"^(nvidia-|triton|cuda-)", re.IGNORECASE)

Fetch = Callable[[str], Mapping[str, Any]]


class NoFamily(RuntimeError):
    """No torch in the course's range has its whole family installable here."""


@dataclass(frozen=True)
class Pick:
    """The family picked, the tested pins it replaces, and why newer torch releases were skipped."""

    versions: dict[str, Version]
    pinned: dict[str, str]
    newest_torch: Version
    skipped: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Return the human report: one line per package, then the skipped releases."""
        out = []
        for name in FAMILY:
            got, was = self.versions[name], self.pinned.get(name)
            note = "the tested pin" if was == str(got) else f"tested: {was}" if was else "not pinned before"
            out.append(f"{name} {got} ({note})")
        if self.versions["torch"] != self.newest_torch:
            out.append(f"newest torch in the course's range on the registry: {self.newest_torch}")
        out += [f"skipped: {why}" for why in self.skipped]
        if self.is_tested_set():
            out.append("the newest family is the tested set: this run checks the same torch family again")
        return out

    def is_tested_set(self) -> bool:
        """Return whether every pick equals the pin in constraints.txt."""
        return all(self.pinned.get(name) == str(self.versions[name]) for name in FAMILY)

    def as_json(self) -> dict[str, Any]:
        """Return the pick as plain data (``--report``)."""
        return {"versions": {k: str(v) for k, v in self.versions.items()}, "pinned": self.pinned,
                "newest_torch": str(self.newest_torch), "skipped": self.skipped,
                "tested_set": self.is_tested_set()}


def declared_ranges(pyproject_text: str, names: Iterable[str] = FAMILY) -> dict[str, SpecifierSet]:
    """Return the version range pyproject.toml's ``dependencies`` declare for each of ``names``.

    Raises KeyError naming a package that is not declared at all."""
    import tomllib

    deps = tomllib.loads(pyproject_text)["project"]["dependencies"]
    ranges = {}
    for dep in deps:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*([^;]*)", dep)
        if m and m.group(1).lower() in names:
            ranges[m.group(1).lower()] = SpecifierSet(m.group(2).strip())
    missing = [n for n in names if n not in ranges]
    if missing:
        raise KeyError(f"pyproject.toml declares no range for {', '.join(missing)}")
    return ranges


def read_pins(constraints_text: str) -> dict[str, str]:
    """Return ``{name: version}`` for the ``name==version`` lines of a constraints file."""
    pins = {}
    for line in constraints_text.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def _wheel_fits(filename: str, tags: frozenset[Tag]) -> bool:
    if not filename.endswith(".whl"):
        return False
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return not wheel_tags.isdisjoint(tags)


def _python_fits(requires_python: str | None, python: str) -> bool:
    if not requires_python:
        return True
    try:
        return Version(python) in SpecifierSet(requires_python)
    except Exception:  # an unreadable requires_python: let pip decide, as it would
        return True


def installable(releases: Mapping[str, list[Mapping[str, Any]]], spec: SpecifierSet, *,
                tags: Iterable[Tag] | None = None, python: str | None = None) -> list[Version]:
    """Return the final releases in ``spec`` that have an installable wheel here, newest first.

    ``releases`` is the index's ``{"version": [file, ...]}`` (each file a dict with ``filename``,
    ``yanked`` and ``requires_python``); ``tags`` and ``python`` default to this interpreter's."""
    tags = frozenset(sys_tags() if tags is None else tags)
    python = python or platform.python_version()
    out = []
    for text, files in releases.items():
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if version.is_prerelease or version.is_devrelease or version not in spec:
            continue
        if any(not f.get("yanked") and _python_fits(f.get("requires_python"), python)
               and _wheel_fits(f.get("filename", ""), tags) for f in files):
            out.append(version)
    return sorted(out, reverse=True)


def torchvision_minor(torch_version: Version) -> tuple[int, int]:
    """Return the (major, minor) of the torchvision built for ``torch_version``: 2.N -> 0.(N + 15)."""
    if torch_version.major != 2:
        raise ValueError(f"the torchvision rule 0.(N + 15) is known for torch 2.N only, not {torch_version}")
    return 0, torch_version.minor + 15


def pick_family(candidates: Mapping[str, list[Version]], pinned: Mapping[str, str]) -> Pick:
    """Return the newest torch whose torchvision and torchaudio exist, with both; ``candidates``
    holds each package's installable releases, newest first (``installable``)."""
    torches = list(candidates["torch"])
    if not torches:
        raise NoFamily("no torch release in the course's range has a wheel for this Python and platform")
    visions, audios = candidates["torchvision"], candidates["torchaudio"]
    skipped = []
    for torch_v in torches:
        want = torchvision_minor(torch_v)
        vision = next((v for v in visions if (v.major, v.minor) == want), None)
        if vision is None:
            newest = f"newest: {visions[0]}" if visions else "none in range"
            skipped.append(f"torch {torch_v} has no torchvision {want[0]}.{want[1]} on the registry yet ({newest})")
            continue
        audio = next((a for a in audios if (a.major, a.minor) <= (torch_v.major, torch_v.minor)), None)
        if audio is None:
            skipped.append(f"torch {torch_v} has no torchaudio release at or below {torch_v.major}.{torch_v.minor}")
            continue
        return Pick({"torch": torch_v, "torchvision": vision, "torchaudio": audio},
                    {k: pinned[k] for k in FAMILY if k in pinned}, torches[0], skipped)
    raise NoFamily("no torch in the course's range has its family on the registry: " + "; ".join(skipped))


def next_constraints(constraints_text: str, pick: Pick) -> str:
    """Return constraints.txt with the family replaced by ``pick`` and torch's own build pins dropped."""
    out = ["# Generated by tools/next_release.py for `make test-next`: the newest torch family on the",
           "# registry inside pyproject.toml's ranges; every other pin as in constraints.txt.",
           *(f"#   {line}" for line in pick.lines())]
    for line in constraints_text.splitlines():
        name = line.split("==")[0].strip().lower()
        if not line.strip() or line.startswith("#") or FOLLOW_TORCH.match(name) or name in FAMILY:
            continue
        out.append(line)
    out += [f"{name}=={pick.versions[name]}" for name in FAMILY]
    return "\n".join(out) + "\n"


def fetch_json(index: str = INDEX, timeout: float = 60.0) -> Fetch:
    """Return a function that reads one package's release list from ``index`` (PyPI's JSON API)."""
    def fetch(name: str) -> Mapping[str, Any]:
        url = f"{index.rstrip('/')}/{name}/json"
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (an https index)
            return json.load(resp)
    return fetch


def choose(fetch: Fetch, pyproject_text: str, constraints_text: str, *,
           tags: Iterable[Tag] | None = None, python: str | None = None) -> Pick:
    """Return the pick for the ranges in ``pyproject_text``, asking ``fetch(name)`` for each package's
    index entry (a dict with ``releases``)."""
    ranges = declared_ranges(pyproject_text)
    tags = frozenset(sys_tags() if tags is None else tags)
    candidates = {name: installable(fetch(name).get("releases", {}), ranges[name], tags=tags, python=python)
                  for name in FAMILY}
    return pick_family(candidates, read_pins(constraints_text))


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that; return whether it wrote."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", default=INDEX, help=f"the JSON API's base URL (default {INDEX})")
    parser.add_argument("--out", type=Path, required=True, help="the constraints file to write")
    parser.add_argument("--report", type=Path, help="also write what was picked, and why, as JSON")
    args = parser.parse_args(argv)
    try:
        pick = choose(fetch_json(args.index), (ROOT / "pyproject.toml").read_text(encoding="utf-8"),
                      (ROOT / "constraints.txt").read_text(encoding="utf-8"))
    except NoFamily as err:
        print(f"next release: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # no network, or the index refused
        print(f"next release: could not read the index at {args.index}: {err}", file=sys.stderr)
        return 1
    for line in pick.lines():
        print(f"next release: {line}", file=sys.stderr)
    wrote = write_if_changed(args.out, next_constraints((ROOT / "constraints.txt").read_text(encoding="utf-8"), pick))
    print(f"next release: {'wrote' if wrote else 'unchanged'} {args.out}", file=sys.stderr)
    if args.report:
        write_if_changed(args.report, json.dumps(pick.as_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
