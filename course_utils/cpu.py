"""Which CPU class is this, and which instruction sets do torch and its libraries use on it?

Several of the course's results depend less on the number of cores than on the CPU's
*instruction sets*: AVX2 or AVX-512 vectors for float kernels, and integer dot-product
instructions (AVX-512 VNNI, AVX-VNNI, AMX on x86; SDOT/UDOT on ARM) for int8. This
module names them and sums them up as one *CPU class* (``x86-avx512-vnni``, ``x86-avx2``,
``arm64``, ...). The *CPU profiles* that make torch, oneDNN, FBGEMM and Inductor act as if
the CPU had fewer instruction sets (to test the course on a laptop-class CPU without owning
one) are kit work: ``course_utils.kit.cpu_profiles`` (``python -m course_utils cpu --profile
avx2 -- CMD``). A profile's emulator reaches this module through ``COURSE_EMULATOR``
(``emulator``, ``python_command``).

What a profile cannot change: libraries that decide by asking the CPU directly
(CPUID) rather than through these settings. ONNX Runtime's kernels (MLAS) and the
choice of ``torch._int_mm``'s oneDNN path are two; ``tests/test_cpu_emulated.py``
covers those by running under an emulated AVX2 CPU (qemu) where it is installed.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

def emulator() -> list[str]:
    """Return the command prefix that runs a program on the emulated CPU of this profile ([] for none)."""
    return shlex.split(os.environ.get("COURSE_EMULATOR", ""))


def python_command() -> list[str]:
    """Return the command that starts this Python on the same (real or emulated) CPU as this process."""
    return [*emulator(), sys.executable]


#: Every CPU class ``classify`` can return, most capable x86 first.
CLASSES = ("x86-amx", "x86-avx512-vnni", "x86-avx512", "x86-avx2-vnni", "x86-avx2", "x86-baseline",
           "arm64-apple", "arm64", "other")

#: The instruction sets that decide the course's results, in the order they are printed.
X86_FEATURES = ("avx2", "avx512_f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8",
                "amx_bf16")
ARM_FEATURES = ("neon", "asimddp", "i8mm", "sve", "sve2", "bf16")


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU has, what torch uses, and the class the course's ranges are keyed by."""

    arch: str
    name: str
    features: tuple[str, ...]
    torch_capability: str
    profile: str | None
    cpu_class: str
    int8_dot: str | None
    #: Under a CPU profile, the int8 dot-product set of the real CPU that the profile hides from ATen,
    #: FBGEMM and Inductor but not from libraries that ask the CPU itself (oneDNN's ``torch._int_mm``
    #: route, ONNX Runtime); None otherwise.
    hidden_int8_dot: str | None = None

    def int8_dot_text(self) -> str:
        """Return what this process's int8 products use, naming a dot-product set the profile hides."""
        if self.int8_dot:
            return self.int8_dot
        if self.hidden_int8_dot:
            return (f"none in ATen, FBGEMM and Inductor (profile {self.profile}); oneDNN (torch._int_mm) and "
                    f"ONNX Runtime ask the CPU itself and still use its {self.hidden_int8_dot}")
        return "none (int8 products go through 16-bit pairs or plain loops)"

    def line(self) -> str:
        """Return a one-line description for setup cells and the doctor."""
        prof = f", profile {self.profile}" if self.profile else ""
        return (f"{self.cpu_class} ({self.name}{prof}): torch vector code {self.torch_capability}; "
                f"int8 dot-product instructions: {self.int8_dot_text()}")


def capabilities() -> dict[str, bool]:
    """Return the CPU's instruction-set flags as torch's cpuinfo reads them (name -> present).

    Uses ``torch.cpu.get_capabilities()`` where the installed torch has it, otherwise the
    flags line of ``/proc/cpuinfo`` (Linux); {} when neither is available.
    """
    from . import compat

    caps = compat.cpu_capabilities()
    if caps:
        return {k: bool(v) for k, v in caps.items() if isinstance(v, bool)}
    return _proc_cpuinfo_flags()


def l2_cache_bytes() -> int:
    """Return the size of one core's L2 cache in bytes as cpuinfo reports it (0 when unknown)."""
    from . import compat

    value = compat.cpu_capabilities().get("l2_cache_size", 0)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def last_level_cache(root: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cache") -> tuple[int, int] | None:
    """Return (level, bytes) of the highest-level data or unified cache Linux lists for CPU 0 under ``root``;
    None where it lists none (macOS, Windows, some containers)."""
    found = []
    for index in Path(root).glob("index*"):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", size)
        if kind != "Instruction" and level.isdigit() and match:
            found.append((int(level), int(match[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match[2]]))
    return max(found, default=None)


def _proc_cpuinfo_flags() -> dict[str, bool]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return {}
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features"):
            names = line.split(":", 1)[1].split()
            # /proc spells AVX-512 foundation "avx512f", cpuinfo "avx512_f"
            return {("avx512_f" if n == "avx512f" else n): True for n in names}
    return {}


def active_profile() -> str | None:
    """Return the name of the CPU profile this process runs under, or None (the real CPU)."""
    name = os.environ.get("COURSE_CPU_PROFILE", "").strip()
    return name or None


def settings_only_profile() -> str | None:
    """Return the active CPU profile's name where it works through settings alone, else None.

    Such a profile (``avx2``, ``default``) caps torch's own code, while the libraries that ask the
    CPU itself (oneDNN, ONNX Runtime's MLAS) still see the real CPU: the profile a "reads the real
    CPU" remark is about. None with no profile, and under an emulating profile (``haswell``), where
    every library sees the emulated CPU.
    """
    return None if emulator() else active_profile()


def classify(arch: str, caps: Mapping[str, bool], torch_capability: str,
             system: str = sys.platform) -> tuple[str, str | None]:
    """Return (CPU class, int8 dot-product instruction set or None) for these facts.

    The class is what the kernels may use, so a profile that caps torch at AVX2 on an
    AVX-512 machine gives ``x86-avx2``. x86 classes, from most to least capable:
    ``x86-amx``, ``x86-avx512-vnni``, ``x86-avx512``, ``x86-avx2-vnni``, ``x86-avx2``,
    ``x86-baseline``; ARM: ``arm64-apple``, ``arm64``; anything else ``other``.
    """
    arch = arch.lower()
    cap = torch_capability.upper()
    if arch in ("x86_64", "amd64", "i386", "i686", "x86"):
        if cap.startswith("AVX512"):
            if caps.get("amx_int8") or caps.get("amx_tile"):
                return "x86-amx", "AMX (int8 tiles) and AVX-512 VNNI"
            if caps.get("avx512_vnni"):
                return "x86-avx512-vnni", "AVX-512 VNNI (VPDPBUSD)"
            return "x86-avx512", None
        if cap == "AVX2":
            # Under the avx2 profile the AVX-512 VNNI of the real CPU is hidden; AVX-VNNI
            # (the 256-bit form on recent laptops) only counts on a real AVX2 CPU.
            if caps.get("avx_vnni") and not caps.get("avx512_f"):
                return "x86-avx2-vnni", "AVX-VNNI (VPDPBUSD on 256-bit vectors)"
            return "x86-avx2", None
        return "x86-baseline", None
    if arch in ("arm64", "aarch64"):
        dot = "ARM dot product (SDOT/UDOT)" if (caps.get("asimddp") or caps.get("neon_dotprod")
                                                 or system == "darwin") else None
        return ("arm64-apple" if system == "darwin" else "arm64"), dot
    return "other", None


def cpu_model() -> str:
    """Return the CPU's model name as the operating system reports it."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True, text=True, timeout=5, check=False,
            )
            if out.stdout.strip():
                return out.stdout.strip()
        except OSError:
            pass
    return platform.processor() or platform.machine() or "unknown"


def info() -> CpuInfo:
    """Return this machine's CPU facts, class and int8 dot-product instructions (cheap: no subprocess)."""
    import torch

    caps = capabilities()
    arch = platform.machine() or "unknown"
    capability = torch.backends.cpu.get_cpu_capability()
    cls, dot = classify(arch, caps, capability)
    wanted = ARM_FEATURES if arch.lower() in ("arm64", "aarch64") else X86_FEATURES
    profile = active_profile()
    hidden = hidden_int8_dot(arch, caps, dot) if profile else None
    return CpuInfo(arch=arch, name=cpu_model(), features=tuple(f for f in wanted if caps.get(f)),
                   torch_capability=capability, profile=profile, cpu_class=cls, int8_dot=dot,
                   hidden_int8_dot=hidden)


def hidden_int8_dot(arch: str, caps: Mapping[str, bool], dot: str | None) -> str | None:
    """Return the int8 dot-product set the CPU's own flags give when it differs from ``dot`` (what the
    capped torch capability gives), else None: what a CPU profile hides from ATen but not from CPUID."""
    real = "AVX512" if caps.get("avx512_f") else "AVX2" if caps.get("avx2") else "DEFAULT"
    real_dot = classify(arch, caps, real)[1]
    return real_dot if real_dot and real_dot != dot else None


def onnxruntime_kernels(caps: Mapping[str, bool] | None = None, arch: str | None = None, *,
                        dtype: str = "int8") -> str:
    """Return which kernel family ONNX Runtime's MLAS picks on this CPU for ``dtype``, read from its flags.

    ``dtype="int8"`` (quantized models: where VNNI and AMX matter) or ``"float32"`` (float models,
    such as notebook 07's). MLAS asks the CPU itself (CPUID), so CPU profiles do not change this;
    only emulation does.
    """
    if dtype not in ("int8", "float32"):
        raise ValueError(f"dtype must be 'int8' or 'float32', not {dtype!r}")
    caps = capabilities() if caps is None else caps
    arch = (arch or platform.machine()).lower()
    if dtype == "float32":
        family = ("ARM NEON" if arch in ("arm64", "aarch64") else "AVX-512" if caps.get("avx512_f")
                  else "AVX2 (FMA)" if caps.get("avx2") else "baseline SSE")
        return f"{family} float kernels"
    if arch in ("arm64", "aarch64"):
        return "ARM NEON kernels" + (" with dot-product (SDOT/UDOT)" if caps.get("asimddp") else "")
    if caps.get("amx_int8") or caps.get("amx_tile"):
        return "AMX and AVX-512 VNNI kernels"
    if caps.get("avx512_vnni"):
        return "AVX-512 VNNI kernels"
    if caps.get("avx_vnni"):
        return "AVX-VNNI kernels"
    if caps.get("avx512_f"):
        return "AVX-512 kernels (int8 pairs summed in 16 bits, which can saturate)"
    if caps.get("avx2"):
        return "AVX2 kernels (int8 pairs summed in 16 bits, which can saturate)"
    return "baseline SSE kernels"


def cpu_class() -> str:
    """Return this machine's CPU class, as ``info().cpu_class``."""
    return info().cpu_class


_ONEDNN_PROBE = (
    "import torch\n"
    "a = torch.ones(16, 64, dtype=torch.int8)\n"
    "torch._int_mm(a, torch.ones(64, 32, dtype=torch.int8))\n"
    "torch.nn.functional.linear(torch.randn(64, 256), torch.randn(256, 256)).sum()\n"
    # a oneDNN convolution, asked for by name: where nothing above runs through oneDNN (an AVX2 CPU
    # without VNNI runs _int_mm in torch's own loop, and linear in a BLAS) this still prints its ISA line
    "if torch.backends.mkldnn.is_available():\n"
    "    torch.ops.aten.mkldnn_convolution(torch.randn(1, 8, 8, 8), torch.randn(8, 8, 3, 3), None,"
    " [0, 0], [1, 1], [1, 1], 1)\n"
)


def onednn_report(timeout_s: float = 120.0) -> dict[str, str]:
    """Return what oneDNN reports in a fresh process: its ISA and whether ``torch._int_mm`` used it.

    Runs a tiny int8 matrix product with ``ONEDNN_VERBOSE=1`` (about two seconds).
    Keys: ``isa`` (oneDNN's own words, such as "AVX2" or "AVX-512 with AVX512BW, AVX512VL, and
    AVX512DQ extensions", or "not reported") and ``int_mm`` ("oneDNN" when torch's int8 GEMM ran
    as a oneDNN primitive, else "torch's own loop"). oneDNN brands every x86 ISA name "Intel"
    ("Intel AVX2", "Intel AVX-512 with Intel DL Boost ..."), whoever made the CPU, so an AMD EPYC
    reported "Intel AVX2"; that word is dropped here, since it names where the instruction set
    came from, not this machine's maker.
    """
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    try:
        out = subprocess.run([*python_command(), "-c", _ONEDNN_PROBE], capture_output=True, text=True,
                             timeout=timeout_s, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"isa": f"probe failed: {err}", "int_mm": "unknown"}
    isa = "not reported"
    used = "torch's own loop (no oneDNN primitive ran)"
    for line in out.stdout.splitlines():
        if ",info,cpu,isa:" in line:
            isa = line.split("isa:", 1)[1].strip().replace("Intel ", "")
        if ",primitive,exec,cpu," in line and "src_s8" in line:
            used = "oneDNN"
    if out.returncode != 0:
        return {"isa": isa, "int_mm": f"probe failed with exit status {out.returncode}"}
    return {"isa": isa, "int_mm": used}
