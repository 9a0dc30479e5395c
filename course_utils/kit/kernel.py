"""The course kernel's entry point: ``python -m course_utils.kit.kernel -f CONNECTION_FILE``.

The kernel ``make kernel`` installs (``lab.install_kernel``) starts through this module instead of
``ipykernel_launcher``, so that each kernel chooses Inductor's compile cache from the environment
it starts in (``config.compile_cache_env``): a ``TORCHINDUCTOR_CACHE_DIR`` set in the shell that
runs ``make lab`` wins, and a CPU profile's settings (``python -m course_utils cpu --profile NAME --
make lab``) get a folder of their own. A folder written into kernel.json at install time would be
shared by every profile, and torch's cache does not key its C++ on ``ATEN_CPU_CAPABILITY``: code
written for AVX2 came back under the ``default`` profile and failed to build (``config.cache_tag``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: The module kernel.json runs in place of ipykernel's own launcher.
MODULE = "course_utils.kit.kernel"


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the variables the kernel sets before it starts: the course's compile cache folder."""
    from .. import config

    return config.compile_cache_env(environ)


def main() -> None:
    """Set the compile cache for this kernel, then start ipykernel as ``ipykernel_launcher`` does."""
    os.environ.update(environment())
    if sys.path and sys.path[0] == "":  # as ipykernel_launcher does: do not import from the notebook's folder first
        del sys.path[0]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
