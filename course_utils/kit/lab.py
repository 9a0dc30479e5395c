"""How JupyterLab starts for a learner: the course kernel, and no "get notified about official
Jupyter news?" pop-up.

The course kernel (``pytorch2-course``) runs this environment's Python with the course's thread
policy in its environment (``course_utils.threads.KERNEL_ENV``: idle OpenMP threads sleep, so a
busy laptop stays usable); ``python -m course_utils.kit.lab`` (run by ``make setup``,
``make kernel`` and so by every ``make lab``) installs it for the current user. It starts through
``course_utils.kit.kernel``, which puts Inductor's compile cache in a folder that survives a reboot
(``course_utils.config.inductor_cache_dir``), chosen when each kernel starts: a
``TORCHINDUCTOR_CACHE_DIR`` set in the shell that runs ``make lab`` is the one its kernels use, and
a CPU profile gets a folder of its own.

JupyterLab reads setting overrides for every user of an environment from
``<sys.prefix>/share/jupyter/lab/settings/overrides.json``. The course's setup (``make setup``)
writes its settings there with ``python -m course_utils.kit.lab``: news fetching off, so the first
thing a learner sees is the course, and JupyterLab makes no request to the web on its own.
Settings already in the file are kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: The course's JupyterLab settings: plugin id -> {setting: value}. The plugin's schema is
#: ``share/jupyter/lab/schemas/@jupyterlab/apputils-extension/notification.json``; its
#: ``fetchNews`` is a string, "true" (always), "false" (never) or "none" (ask: the pop-up).
OVERRIDES: dict[str, dict[str, object]] = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},
}


def overrides_path(prefix: Path | str | None = None) -> Path:
    """Return the overrides file JupyterLab reads in environment ``prefix`` (default: this one)."""
    return Path(sys.prefix if prefix is None else prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"


def write_overrides(prefix: Path | str | None = None) -> Path:
    """Return the overrides file of ``prefix`` after merging the course's settings into it.

    Other plugins' settings and other keys of the same plugin are kept. Raises ValueError when
    the existing file is not a JSON object (it is left as it is).
    """
    path = overrides_path(prefix)
    current: object = {}
    if path.exists():
        try:
            current = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON ({err}); fix or remove it, then run "
                             "`make setup` again") from err
        if not isinstance(current, dict):
            raise ValueError(f"{path} should hold a JSON object of plugin settings")
    for plugin, settings in OVERRIDES.items():
        current.setdefault(plugin, {}).update(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")
    return path


KERNEL_NAME = "pytorch2-course"
KERNEL_DISPLAY_NAME = "PyTorch 2 course (.venv)"


def display_name(prefix: Path | str | None = None) -> str:
    """Return the kernel's name in JupyterLab for environment ``prefix`` (default: this one):
    ``KERNEL_DISPLAY_NAME``, or "PyTorch 2 course (conda: NAME)" in a conda environment (README's
    conda route)."""
    prefix = Path(sys.prefix if prefix is None else prefix)
    if (prefix / "conda-meta").is_dir():
        return f"PyTorch 2 course (conda: {prefix.name})"
    return KERNEL_DISPLAY_NAME


def kernel_env() -> dict[str, str]:
    """Return the variables kernel.json gives the course kernel: the thread policy (the compile
    cache is chosen by ``course_utils.kit.kernel`` when the kernel starts)."""
    from ..threads import KERNEL_ENV

    return dict(KERNEL_ENV)


def install_kernel(prefix: str | None = None) -> Path:
    """Install the course kernel (this Python, started through ``course_utils.kit.kernel``, with
    ``kernel_env()``'s variables) and return its folder: for the current user, or under ``prefix``
    when given (tests)."""
    from ipykernel.kernelspec import install

    from .kernel import MODULE

    folder = Path(install(user=prefix is None, prefix=prefix, kernel_name=KERNEL_NAME,
                          display_name=display_name(), env=kernel_env()))
    spec_file = folder / "kernel.json"
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    argv = spec["argv"]
    if "ipykernel_launcher" not in argv:
        raise RuntimeError(f"{spec_file} does not start ipykernel_launcher ({argv}); this ipykernel "
                           "writes kernel specs the course does not know how to adapt")
    spec["argv"] = [MODULE if part == "ipykernel_launcher" else part for part in argv]
    spec_file.write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    return folder


if __name__ == "__main__":
    print(f"JupyterLab settings for the course: {write_overrides()}")
    from .. import config

    print(f"Kernel {KERNEL_NAME} -> {sys.executable} (in {install_kernel()}); "
          f"compile cache (chosen as each kernel starts; here now) {config.inductor_cache_dir()}")
