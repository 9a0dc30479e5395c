"""How does the course test itself on CPUs it does not have? CPU profiles, and the command that runs under one.

``python -m course_utils cpu`` prints this machine's CPU class (``course_utils.cpu``);
``python -m course_utils cpu --profile NAME -- CMD`` runs CMD with a profile's settings, which
``make test-avx2`` and ``make test-haswell`` use. What a profile cannot change: libraries that
decide by asking the CPU directly (CPUID) rather than through these settings. ONNX Runtime's
kernels (MLAS) and the choice of ``torch._int_mm``'s oneDNN path are two;
``tests/test_cpu_emulated.py`` covers those under an emulated AVX2 CPU (qemu) where it is installed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping

from ..cpu import info, onednn_report

#: Environment settings of each CPU profile.
#:
#: ``avx2`` caps ATen's vectorised kernels and Inductor's generated code
#: (ATEN_CPU_CAPABILITY) and FBGEMM, torch.ao's int8 library (FBGEMM_ENABLE_INSTRUCTIONS).
#: It leaves oneDNN alone on purpose: torch picks ``torch._int_mm``'s route from the real
#: CPU (CPUID), and a oneDNN capped below that route computes int8 products that saturate,
#: a combination no real CPU has. TORCHINDUCTOR_CPP_MARCH keeps gcc from using instructions
#: of the real CPU (``-march=native``) in the C++ that Inductor builds. ``default`` also turns
#: vectorisation off.
#:
#: ``haswell`` is the faithful one: notebook kernels and probes run under qemu's user-mode
#: emulation of an AVX2 CPU without AVX-512 or VNNI (``COURSE_EMULATOR``), so every library,
#: ONNX Runtime included, sees that CPU through CPUID. It needs ``qemu-x86_64`` (Debian's
#: qemu-user) and runs a few times slower.
PROFILES: Mapping[str, Mapping[str, str]] = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "TORCHINDUCTOR_CPP_MARCH": "haswell",
        "COURSE_CPU_PROFILE": "avx2",
    },
    "default": {
        "ATEN_CPU_CAPABILITY": "default",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "COURSE_CPU_PROFILE": "default",
    },
    "haswell": {
        "COURSE_EMULATOR": "qemu-x86_64 -cpu Haswell",
        "TORCHINDUCTOR_CPP_MARCH": "haswell",
        "COURSE_CPU_PROFILE": "haswell",
    },
}


def profile_env(name: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return ``base`` (default: this process's environment) with CPU profile ``name`` applied."""
    if name not in PROFILES:
        raise ValueError(f"unknown CPU profile {name!r}; choose one of: {', '.join(PROFILES)}")
    env = dict(os.environ if base is None else base)
    env.update(PROFILES[name])
    wrapper = shlex.split(env.get("COURSE_EMULATOR", ""))
    if wrapper and shutil.which(wrapper[0]) is None:
        raise RuntimeError(f"CPU profile {name!r} needs {wrapper[0]!r}, which is not installed "
                           "(Debian/Ubuntu: `sudo apt-get install qemu-user`)")
    return env


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils cpu [--probe] [--profile NAME -- CMD ...]``: report, or run CMD under a profile."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_utils cpu",
                                     description="Show the CPU class, or run a command under a CPU profile.")
    parser.add_argument("--profile", choices=sorted(PROFILES), help="run CMD with this CPU profile's settings")
    parser.add_argument("--probe", action="store_true", help="also ask oneDNN what it uses (a fresh process)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run under --profile")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.profile:
        if not cmd:
            parser.error("--profile needs a command after --, e.g. -- make test")
        try:
            env = profile_env(args.profile)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print("CPU profile " + args.profile + ": " + " ".join(f"{k}={v!r}" for k, v in PROFILES[args.profile].items()),
              flush=True)
        try:
            return subprocess.call(cmd, env=env)
        except OSError as err:
            print(f"error: cannot run {cmd[0]!r}: {err}", file=sys.stderr)
            return 127
    if cmd:
        parser.error("a command is only run with --profile NAME")
    cpu = info()
    print(cpu.line())
    print("instruction sets: " + (", ".join(cpu.features) or "none of the ones the course tracks"))
    if args.probe:
        for key, value in onednn_report().items():
            print(f"oneDNN {key}: {value}")
    return 0
