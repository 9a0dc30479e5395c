"""What a job script imports to take part in a course job: join the group, log a line, hand back the result.

Notebook 12 writes its job scripts (``%%writefile``) and ``launch.run_job`` starts them under
torchrun. A script calls ``init()`` (joins the process group from the variables torchrun sets),
prints with ``log(...)``, ends with ``emit(result)`` (rank 0 writes one ``COURSE_RESULT {json}``
line, which ``launch.parse_result`` reads) and ``finish()``. Nothing here knows what a job does.

Every line goes out in a single ``write`` system call, so lines from other ranks sharing the same
pipe cannot land inside it: on Linux a pipe write of up to ``select.PIPE_BUF`` bytes (4096) is
atomic; a longer result line is still one call, and the launcher's parser copes with other text
around it.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

#: The prefix of the one line of output that carries a job's result (``launch.parse_result`` reads it).
RESULT_MARKER = "COURSE_RESULT "


def init(backend: str = "gloo") -> tuple[int, int]:
    """Return (rank, world size) after joining the process group torchrun described in the environment."""
    if "RANK" not in os.environ:
        raise RuntimeError("this script runs under torchrun: launch.run_job(script) from a notebook, or "
                           "python -m course_utils.distributed.loopback --nproc-per-node 2 script.py")
    torch.set_num_threads(1)
    if dist.is_initialized():
        pass
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent hosts the store
        dist.init_process_group(backend, store=attempt_store(), rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def attempt_store() -> dist.Store:
    """Return the launcher's key-value store, with keys of their own for this attempt of the job.

    After torchrun restarts a failed job, the store may still hold the addresses the dead workers
    published; prefixing every key with the restart count keeps the new workers from reading them.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timedelta(seconds=120))
    return dist.PrefixStore(f"course/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def finish() -> None:
    """Leave the process group (every rank waits for the others first)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def write_line(text: str) -> None:
    """Write ``text`` and its newline to standard output in one system call (flushing what Python buffered first)."""
    sys.stdout.flush()
    data = (text.replace("\n", " ") + "\n").encode("utf-8", "backslashreplace")
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a notebook's stream): one write call
        sys.stdout.write(data.decode("utf-8"))
        sys.stdout.flush()
        return
    while data:  # a pipe takes everything at once; a full pipe (or a signal) may take less
        data = data[os.write(fd, data):]


def result_line(result: dict[str, Any]) -> str:
    """Return the result line for ``result``: the marker, then compact JSON, on one line."""
    return RESULT_MARKER + json.dumps(result, separators=(",", ":"))


def emit(result: dict[str, Any]) -> None:
    """Write ``result`` as the job's result line, on rank 0 only (``launch.parse_result`` reads it)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_line(result_line(result))


def log(message: str) -> None:
    """Write ``message`` prefixed with this process's rank, as one line in one system call."""
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    write_line(f"[rank {rank}] {message}")
