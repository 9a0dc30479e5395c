"""Start a ``torchrun`` job on this machine, stream its output, and read the result it prints.

``torchrun_command(...)`` builds the command line (loopback address, a free port, the course's
``PYTHONPATH``); ``run_job(...)`` runs it with a timeout, passes every output line to a callback
(``print`` in a notebook), stops the launcher and every worker it started at the end, whatever
happened (an error, the timeout, a notebook interrupt), and returns the JSON result that rank 0
printed with ``runtime.emit``. The same module runs from a terminal with
``torchrun --nproc-per-node 2 -m course_utils.distributed.ddp``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import config, fresh
from ..serving.server import free_port
from .runtime import RESULT_MARKER

#: The job kinds, each a module ``course_utils.distributed.<kind>``.
KINDS = ("collectives", "ddp", "fsdp", "dtensor", "dcp", "elastic")


class JobError(RuntimeError):
    """A torchrun job failed, timed out or printed no result; the message holds its output's tail."""


@dataclass
class JobResult:
    """What a job printed (``result``: rank 0's JSON) and how it ended."""

    result: dict[str, Any]
    returncode: int
    seconds: float
    lines: list[str] = field(default_factory=list)


def torchrun_command(module: str, args: Sequence[str] = (), *, nproc: int = 2, port: int | None = None,
                     max_restarts: int = 0, python: str | None = None) -> list[str]:
    """Return the ``torchrun`` command (as ``python -m torch.distributed.run``) for one machine.

    ``module`` is a job kind (``"ddp"``) or a full module name; the rendezvous is on
    127.0.0.1 at ``port`` (a free one unless given).
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc must be a positive whole number, got {nproc!r}")
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more, got {max_restarts!r}")
    if module in KINDS:
        module = f"{__package__}.{module}"
    if not module or module.startswith("-") or " " in module:
        raise ValueError(f"not a module name: {module!r}; use one of {', '.join(KINDS)} or a dotted name")
    port = free_port() if port is None else port
    # The c10d rendezvous (rather than the static one --master-addr gives) starts each restart in a
    # new round with fresh keys, so restarted workers never read a dead worker's address.
    return [python or sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "course", "--local-addr", "127.0.0.1",
            "--max-restarts", str(max_restarts), "--monitor-interval", "0.2",
            "-m", module, *[str(a) for a in args]]


def multinode_command(module: str, args: Sequence[str] = (), *, nnodes: int, nproc_per_node: int,
                      endpoint: str, job_id: str = "course-job", node_rank: int | None = None,
                      max_restarts: int = 3) -> list[str]:
    """Return the ``torchrun`` command that each of ``nnodes`` machines runs for the same job.

    ``endpoint`` is ``host:port`` of the rendezvous (the c10d store, on one of the machines);
    with ``node_rank`` given the ranks of the machines are fixed, otherwise torchrun assigns them.
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError("nnodes and nproc_per_node must be at least 1")
    if ":" not in endpoint:
        raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
    if module in KINDS:
        module = f"{__package__}.{module}"
    cmd = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job_id,
           "--max-restarts", str(max_restarts)]
    if node_rank is not None:
        cmd += ["--node-rank", str(node_rank)]
    return [*cmd, "-m", module, *[str(a) for a in args]]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment of a job: this one, the course's ``PYTHONPATH``, unbuffered output, one thread each.

    Built by ``fresh.child_env`` (the course's one recipe for a Python child); ``extra`` comes last.
    """
    own = {"PYTHONUNBUFFERED": "1"}
    for key, value in (("OMP_NUM_THREADS", "1"),    # what torchrun would set anyway (and print a banner about)
                       ("KINETO_LOG_LEVEL", "6")):  # keep the profiler's start/stop lines out of the output
        if key not in os.environ:
            own[key] = value
    return fresh.child_env({**own, **(extra or {})})


def parse_result(lines: Sequence[str]) -> dict[str, Any]:
    """Return the JSON object of the last line that starts with ``RESULT_MARKER``; ValueError if none."""
    for line in reversed(lines):
        at = line.find(RESULT_MARKER)
        if at >= 0:
            text = line[at + len(RESULT_MARKER):].strip()
            try:
                result = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"the result line is not JSON: {text[:200]!r}") from err
            if not isinstance(result, dict):
                raise ValueError(f"the result must be a JSON object, got {type(result).__name__}")
            return result
    raise ValueError(f"the job printed no line starting with {RESULT_MARKER.strip()!r}")


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil ships with Jupyter's kernel
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_job(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """Stop torchrun and every process it started: SIGTERM to the launcher, then SIGKILL to what is left.

    torchrun starts each worker in a session of its own, so the workers are found (with psutil)
    before the launcher is signalled, and killed afterwards if they outlived it.
    """
    children = _descendants(proc.pid)
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers and waits for them
            proc.wait(grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(5)
    for child in children:
        try:
            if child.is_running():
                child.kill()
        except Exception:  # noqa: BLE001 - it ended on its own meanwhile
            pass


def run_job(kind: str, args: Sequence[str] = (), *, nproc: int = 2, max_restarts: int = 0,
            timeout_s: float = 300.0, echo: Callable[[str], Any] | None = print,
            env: Mapping[str, str] | None = None, check: bool = True) -> JobResult:
    """Return the result of a torchrun job of ``kind``, run on 127.0.0.1 with a timeout.

    Each output line goes to ``echo`` as it arrives (None: keep quiet). The launcher and all its
    workers are stopped when the call returns or raises. With ``check``, a non-zero exit or a
    missing result raises ``JobError`` with the end of the output.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    cmd = torchrun_command(kind, args, nproc=nproc, max_restarts=max_restarts)
    lines: list[str] = []
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env(env), cwd=config.REPO_ROOT, start_new_session=True, bufsize=1)
    pipe: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            pipe.put(line.rstrip("\n"))
        pipe.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed_out = False
    try:
        while True:
            left = timeout_s - (time.monotonic() - start)
            if left <= 0:
                timed_out = True
                break
            try:
                line = pipe.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                break
            lines.append(line)
            if echo is not None:
                echo(line)
        if not timed_out:
            proc.wait(max(1.0, timeout_s - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        stop_job(proc)
        reader.join(2)
    seconds = time.monotonic() - start
    tail = "\n".join(lines[-40:])
    if timed_out:
        raise JobError(f"{kind} job stopped after its {timeout_s:.0f} s timeout; output tail:\n{tail}")
    try:
        result = parse_result(lines)
    except ValueError as err:
        if check:
            raise JobError(f"{kind} job exited with status {proc.returncode} and {err}; output tail:\n{tail}") from err
        result = {}
    if check and proc.returncode != 0:
        raise JobError(f"{kind} job exited with status {proc.returncode}; output tail:\n{tail}")
    return JobResult(result=result, returncode=proc.returncode, seconds=seconds, lines=lines)
