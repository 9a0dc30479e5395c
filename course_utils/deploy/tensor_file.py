"""The course's plain tensor file format, shared by its C++ programs (``cpp/aoti_loader``,
``cpp/libtorch_mlp``) and Python.

8 bytes of magic ``AOTITNSR``, an int64 count of dimensions ``n``, ``n`` int64 sizes, then the
float32 values in row-major order; everything little-endian. Deliberately plain, so the C++ side
needs no pickle reader. Integer labels travel as float32 (exact for small integers).
"""

from __future__ import annotations

import struct
from pathlib import Path

import torch

#: First bytes of every tensor file.
MAGIC = b"AOTITNSR"


def write_tensor(path: str | Path, tensor: torch.Tensor) -> Path:
    """Return ``path`` after writing ``tensor`` (as float32, on the CPU) in the course's format."""
    t = tensor.detach().to("cpu", torch.float32).contiguous()
    path = Path(path)
    with path.open("wb") as fh:
        fh.write(MAGIC)
        fh.write(struct.pack("<q", t.dim()))
        fh.write(struct.pack(f"<{t.dim()}q", *t.shape))
        fh.write(t.numpy().astype("<f4", copy=False).tobytes())
    return path


def read_tensor(path: str | Path) -> torch.Tensor:
    """Return the float32 tensor stored in ``path`` (the course's format); ValueError if malformed."""
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise ValueError(f"{path} is not a tensor file (it does not start with {MAGIC!r})")
    (ndim,) = struct.unpack_from("<q", data, 8)
    if not 0 <= ndim <= 16:
        raise ValueError(f"{path}: implausible number of dimensions {ndim}")
    shape = struct.unpack_from(f"<{ndim}q", data, 16)
    offset = 16 + 8 * ndim
    count = 1
    for size in shape:
        count *= size
    if len(data) - offset != 4 * count:
        raise ValueError(f"{path}: shape {tuple(shape)} needs {4 * count} bytes of values, "
                         f"found {len(data) - offset}")
    values = torch.frombuffer(bytearray(data[offset:]), dtype=torch.float32) if count else torch.empty(0)
    return values.reshape(shape).clone()
