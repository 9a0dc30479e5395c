"""Root pytest hooks that apply to the notebooks as well as the unit tests."""

from __future__ import annotations

import os
import shlex


def _kernels_on_the_emulated_cpu() -> None:
    """Under an emulated CPU profile (``COURSE_EMULATOR``), start nbval's notebook kernels inside it.

    nbval's ``--nbval-current-env`` kernel is this Python (``ipykernel.kernelspec``); a prefix
    such as ``qemu-x86_64 -cpu Haswell`` makes every library in the kernel see that CPU.
    """
    prefix = shlex.split(os.environ.get("COURSE_EMULATOR", ""))
    if not prefix:
        return
    import ipykernel.kernelspec as kernelspec

    original = kernelspec.get_kernel_dict

    def emulated(*args, **kwargs):
        spec = original(*args, **kwargs)
        spec["argv"] = prefix + list(spec["argv"])
        return spec

    kernelspec.get_kernel_dict = emulated


_kernels_on_the_emulated_cpu()


def _thread_policy() -> None:
    """Give this process and every kernel it starts the course's thread policy (idle OpenMP threads
    sleep; see ``course_utils.threads``). Set before torch is imported; an explicit value wins."""
    from course_utils.threads import KERNEL_ENV

    for key, value in KERNEL_ENV.items():
        os.environ.setdefault(key, value)


_thread_policy()


def _progress_in_a_temporary_file() -> None:
    """Send the exercise checks' progress lines (``COURSE_PROGRESS``) of this run, and of every notebook
    kernel it starts, to a temporary file removed at exit: never to the learner's own record."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="course-progress-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["COURSE_PROGRESS"] = os.path.join(folder, "progress.jsonl")


_progress_in_a_temporary_file()


def _compile_cache() -> None:
    """Give this process and every kernel it starts the course's compile cache (a folder in the
    user's cache that survives a reboot, ``course_utils.config.inductor_cache_dir``), the one the
    course kernel and the notebook runner use; a ``TORCHINDUCTOR_CACHE_DIR`` already set wins."""
    from course_utils import config

    os.environ.update(config.compile_cache_env())


_compile_cache()


# ---- offline guard for everything the tests start (issue 15) ------------------------------------
def pytest_configure(config) -> None:
    """Give every Python child process (nbval's notebook kernels, servers, tools) the offline guard.

    The variables from ``course_utils.kit.offline.child_env()`` make ``tools/offline/sitecustomize.py``
    install the guard at start-up; the pytest process itself is guarded by ``tests/conftest.py``.
    ``COURSE_OFFLINE=0`` in the environment leaves the network open (for debugging only).
    """
    if os.environ.get("COURSE_OFFLINE") == "0":
        return
    from course_utils.kit import offline

    os.environ.update(offline.child_env())
# ---- end of the offline guard hook ----------------------------------------------------------------
