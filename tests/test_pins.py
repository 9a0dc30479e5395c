"""The package metadata, the constraints file and the conda environment must agree."""

import os
import re
import tomllib

from course_utils import config, doctor

ROOT = config.REPO_ROOT


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
        m = re.match(r"^\s+-\s+([A-Za-z0-9_.\-]+)==([^\s#]+)", line)
        if m:
            pins[norm(m.group(1))] = m.group(2)
    return pins


def declared() -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # Core and dev are pinned; other extras (executorch) are optional and resolved at install time.
    deps = meta["dependencies"] + meta["optional-dependencies"]["dev"]
    return [norm(re.split(r"[<>=!~ ;\[]", d)[0]) for d in deps]


def test_course_torch_set_is_pinned():
    pins = constraints()
    assert pins["torch"] == "2.14.1"
    assert pins["torchvision"] == "0.29.1"
    assert pins["torchaudio"] == "2.11.1"


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
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in meta["dependencies"] if "==" in d]


def test_installed_versions_are_the_pinned_ones():
    from course_utils.env import package_version

    # `make test-min` installs the floor set and names it in COURSE_CONSTRAINTS.
    pins = constraints(os.environ.get("COURSE_CONSTRAINTS", "constraints.txt"))
    for name in declared():
        assert package_version(name) == pins[name], f"{name}: run `make setup` to install the pins"


def test_doctor_minimums_match_metadata():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lower = {norm(re.split(r"[<>=!~ ;\[]", d)[0]): re.search(r">=([\d.]+)", d).group(1)
             for d in meta["dependencies"] if ">=" in d}
    for name, minimum in doctor.REQUIRED_PACKAGES:
        assert lower[norm(name)] == minimum, f"{name}: doctor says {minimum}, pyproject says {lower[norm(name)]}"
