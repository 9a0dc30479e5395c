"""The package metadata, the constraints file and the conda environment must agree."""

import os
import re
import sys

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from course_utils import config
from course_utils.kit import doctor

ROOT = config.REPO_ROOT


def pyproject() -> dict:
    """Return pyproject.toml parsed (tomllib from Python 3.11; tomli, which pytest needs, on 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints(path: str = "constraints.txt") -> dict[str, str]:
    pins = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[norm(name)] = version
    return pins


def conda_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s+-\s+([A-Za-z0-9_.\-]+)(?:\[[A-Za-z0-9_,\-]+\])?==([^\s#]+)", line)
        if m:
            pins[norm(m.group(1))] = m.group(2)
    return pins


def declared() -> list[str]:
    meta = pyproject()["project"]
    # Core and dev are pinned here; the executorch extra is pinned in constraints-executorch.txt (tests/test_executorch.py).
    deps = meta["dependencies"] + meta["optional-dependencies"]["dev"]
    return [norm(re.split(r"[<>=!~ ;\[]", d)[0]) for d in deps]


def test_course_torch_set_is_pinned_and_agrees_everywhere():
    """constraints.txt pins the torch set; the range, the README, the floor and torchvision agree."""
    pins = constraints()
    torch, vision, audio = (Version(pins[name]) for name in ("torch", "torchvision", "torchaudio"))
    meta = pyproject()["project"]
    declared_torch = next(d for d in meta["dependencies"] if re.match(r"torch\b(?![-_])", d))
    assert torch in SpecifierSet(declared_torch[len("torch"):]), f"the pinned torch {torch} is outside {declared_torch}"
    # torchvision 0.(N + 15) is built for torch 2.N
    assert (vision.major, vision.minor) == (0, torch.minor + 15), f"torchvision {vision} does not match torch {torch}"
    assert audio.major == 2, f"torchaudio {audio}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.search(r"torch (\S+), torchvision (\S+), torchaudio (\S+?)[ ,]", readme)
    assert said, "README.md no longer names the tested torch set ('torch X, torchvision Y, torchaudio Z')"
    assert said.groups() == (pins["torch"], pins["torchvision"], pins["torchaudio"]), (
        f"README.md names {said.groups()}, constraints.txt pins "
        f"{(pins['torch'], pins['torchvision'], pins['torchaudio'])}")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from min_constraints import FLOOR
    finally:
        sys.path.remove(str(ROOT / "tools"))
    floor = Version(FLOOR["torch"])
    assert f"{floor.major}.{floor.minor}" == doctor.TORCH_MIN, "tools/min_constraints.py and the doctor disagree"
    assert Version(FLOOR["torchvision"]).minor == floor.minor + 15
    assert floor in SpecifierSet(declared_torch[len("torch"):]) and floor < torch


def test_every_declared_dependency_is_pinned_in_both_files():
    pins, conda = constraints(), conda_pins()
    for name in declared():
        assert name in pins, f"{name} is declared in pyproject.toml but not pinned in constraints.txt"
        assert name in conda, f"{name} is declared in pyproject.toml but missing from environment.yml"


def test_conda_pins_equal_constraints():
    pins = constraints()
    for name, version in conda_pins().items():
        assert pins.get(name) == version, (
            f"environment.yml pins {name}=={version}, constraints.txt has {pins.get(name)}")


def test_metadata_uses_ranges_not_exact_pins():
    meta = pyproject()["project"]
    assert not [d for d in meta["dependencies"] if "==" in d]


def test_installed_versions_are_the_pinned_ones():
    from course_utils.kit.env import package_version

    # `make test-min` installs the floor set and names it in COURSE_CONSTRAINTS.
    pins = constraints(os.environ.get("COURSE_CONSTRAINTS", "constraints.txt"))
    for name in declared():
        # a TORCH=cpu .venv holds torch's CPU build, 2.14.1+cpu: the same release
        assert package_version(name).removesuffix("+cpu") == pins[name], f"{name}: run `make setup` to install the pins"


def test_doctor_torch_floor_matches_metadata():
    """The doctor reads every other minimum from the metadata; its named torch floor must agree too."""
    torch_req = next(r for r in doctor.required_packages() if r.name == "torch")
    assert SpecifierSet(f">={doctor.TORCH_MIN}") in [SpecifierSet(str(s)) for s in torch_req.specifier], (
        f"doctor.TORCH_MIN {doctor.TORCH_MIN} is not pyproject's torch floor ({torch_req.specifier})")
