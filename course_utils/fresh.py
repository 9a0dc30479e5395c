"""Run a Python script in a new process, optionally with empty compile caches, and read its JSON result.

Answers "what does this take the first time, on a machine that never compiled it?": a cold start
can only be measured in a process that has compiled nothing, with an Inductor cache directory
(FX graph, AOTAutograd and C++ build caches) that holds nothing. Notebook 11 times whole-model and
regional compilation this way, and runs its ``TORCH_TRACE`` example in a process of its own. Inductor's
precompiled C++ header is not in that directory (torch 2.14 keeps it under the temporary directory), so
these cold runs find it ready wherever a compile with the same compiler flags built it before (notebook 11
counts the headers around its cold starts); pass an empty folder as ``TMPDIR`` in ``env`` to build it too.

The script prints its result as one JSON object on its last line of standard output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import config

#: The environment variables that point torch's compile caches somewhere (all set for a cold run).
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def child_env(extra: Mapping[str, str] | None = None, cache_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Return the environment of a child Python that imports this ``course_utils``.

    ``cache_dir`` (when given) becomes the Inductor cache directory, with Triton's cache inside
    it; ``extra`` is applied last. ``os.environ`` itself is not changed.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = config.child_pythonpath(environ=env)
    if cache_dir is not None:
        root = Path(cache_dir)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(root)
        env["TRITON_CACHE_DIR"] = str(root / "triton")
    for key, value in (extra or {}).items():
        if not isinstance(value, str):
            raise TypeError(f"environment values must be strings; {key}={value!r}")
        env[key] = value
    return env


def last_json(stdout: str) -> dict[str, Any]:
    """Return the JSON object on the last non-empty line of ``stdout``; ValueError if there is none."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the script printed nothing; it must print its result as JSON on its last line")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as err:
        raise ValueError(f"the script's last line is not JSON: {lines[-1][:200]!r}") from err
    if not isinstance(result, dict):
        raise ValueError(f"the script's last line must be a JSON object, got {type(result).__name__}")
    return result


def run_script(source: str, args: Sequence[str] = (), *, cold: bool = True,
               env: Mapping[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """Return the JSON result of running ``source`` as a script in a new Python process.

    With ``cold`` (the default) the process gets a new, empty Inductor/Triton cache directory that
    is deleted afterwards, so whatever it compiles is compiled from nothing. ``env`` adds
    environment variables (say ``TORCH_TRACE``). The script runs from the repository root with
    this interpreter. A failing script raises RuntimeError with the end of its error output.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError("run_script needs the script's source code as a non-empty string")
    with tempfile.TemporaryDirectory(prefix="course_fresh_") as tmp:
        script = Path(tmp) / "script.py"
        script.write_text(source, encoding="utf-8")
        cache = Path(tmp) / "inductor_cache" if cold else None
        try:
            proc = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=config.REPO_ROOT,
                                  env=child_env(env, cache), capture_output=True, text=True, timeout=timeout)
        finally:
            if cache is not None:
                shutil.rmtree(cache, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the script failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")
    return last_json(proc.stdout)
