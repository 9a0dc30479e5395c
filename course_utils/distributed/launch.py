"""Start a job script under ``torchrun`` on this machine, stream its output, and read the result it prints.

``run_job(script, args)`` runs ``script`` (a file, such as one a notebook cell wrote with
``%%writefile``) on ``nproc`` processes, with a timeout; it passes every output line to a callback
(``print`` in a notebook), stops the launcher and every worker it started at the end, whatever
happened (an error, the timeout, a notebook interrupt), and returns the JSON result that rank 0
wrote with ``runtime.emit``. ``torchrun_command(...)`` is the command line it runs.

Where the job listens, and who can reach it (details in ``loopback``'s docstring):

- the command is ``python -m course_utils.distributed.loopback`` with torchrun's arguments: plain
  torchrun's key-value stores listen on every interface, unauthenticated, even with a 127.0.0.1
  endpoint; through ``loopback`` the rendezvous store and the store the workers share (each on a
  port the system picks) listen on 127.0.0.1 only;
- each worker's gloo sockets listen on the loopback interface's address (``GLOO_SOCKET_IFNAME``),
  and so do NCCL's bootstrap sockets on a GPU machine (``NCCL_SOCKET_IFNAME``);
- each job has a rendezvous id of its own (``course-<random hex>``) and hosts its store itself
  (``--rdzv-conf is_host=1``): it never joins another job's store as a client (a port given
  explicitly that is taken makes it fail), and another course job never joins it, having neither
  its port nor its id. Loopback is shared by every user of a machine, and the store has no
  password: on a shared host only a network namespace per user keeps other users out.

The result line is ``runtime.RESULT_MARKER`` followed by JSON. Several ranks write to the same
pipe, so ``parse_result`` finds the marker anywhere in a line and reads the one JSON value after
it, whatever text another rank wrote before it or right after it.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import config, fresh
from .loopback import loopback_interface
from .runtime import RESULT_MARKER

__all__ = ["RESULT_MARKER", "JobError", "JobResult", "child_env", "job_id", "listening_sockets", "multinode_command",
           "loopback_problem", "parse_result", "run_job", "stop_job", "torchrun_command"]


class JobError(RuntimeError):
    """A torchrun job failed, timed out or printed no result; the message holds its output's tail."""


@dataclass
class JobResult:
    """What a job printed (``result``: rank 0's JSON) and how it ended."""

    result: dict[str, Any]
    returncode: int
    seconds: float
    lines: list[str] = field(default_factory=list)


def _script(script: str | os.PathLike[str]) -> Path:
    path = Path(script)
    if path.suffix != ".py" or str(script).startswith("-"):
        raise ValueError(f"not a Python script: {str(script)!r} (a job is a .py file, e.g. build/nb12/ddp.py)")
    return path


def job_id() -> str:
    """Return a fresh rendezvous id (``course-`` and 12 random hex digits): one job's private meeting point."""
    return f"course-{secrets.token_hex(6)}"


def torchrun_command(script: str | os.PathLike[str], args: Sequence[Any] = (), *, nproc: int = 2,
                     port: int | None = None, max_restarts: int = 0, python: str | None = None,
                     rdzv_id: str | None = None) -> list[str]:
    """Return the command that runs ``script`` under torchrun on this machine, every socket on loopback.

    It is ``python -m course_utils.distributed.loopback`` (torchrun, with its stores bound to
    127.0.0.1) with a c10d rendezvous on 127.0.0.1 at ``port`` (unless given, 0: the system picks a
    free one when the store starts, as ``torchrun --standalone`` does), hosted by this launcher,
    under ``rdzv_id`` (a fresh ``job_id()`` unless given).
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc must be a positive whole number, got {nproc!r}")
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more, got {max_restarts!r}")
    path = _script(script)
    port = 0 if port is None else port  # 0: the store's socket gets a free port from the system, no race
    # The c10d rendezvous (rather than the static one --master-addr gives) starts each restart in a
    # new round with fresh keys, so restarted workers never read a dead worker's address.
    return [python or sys.executable, "-m", f"{__package__}.loopback", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", rdzv_id or job_id(), "--rdzv-conf", "is_host=1", "--local-addr", "127.0.0.1",
            "--max-restarts", str(max_restarts), "--monitor-interval", "0.2",
            str(path), *[str(a) for a in args]]


def multinode_command(script: str | os.PathLike[str], args: Sequence[Any] = (), *, nnodes: int,
                      nproc_per_node: int, endpoint: str, job_id: str = "course-job", max_restarts: int = 3) -> list[str]:
    """Return the ``torchrun`` command that each of ``nnodes`` machines runs, the same on every one, for one job.

    ``endpoint`` is ``host:port`` of the rendezvous (the c10d store, on one of the machines). The command
    names no node rank: the c10d rendezvous numbers the machines itself once all of them have joined
    (torchrun ignores ``--node-rank`` unless the rendezvous is static), so one line serves every machine,
    a replacement machine included. This is plain torchrun: its store listens on every interface of the
    machine that hosts it, which a cluster needs, so that port belongs behind the cluster's firewall.
    """
    for name, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more, got {max_restarts!r}")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
    path = _script(script)
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job_id,
            "--max-restarts", str(max_restarts), str(path), *[str(a) for a in args]]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment of a job: this one, the course's ``PYTHONPATH``, unbuffered output, one thread each.

    Built by ``fresh.child_env`` (the course's one recipe for a Python child); gloo and NCCL are
    told to use the loopback interface (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``) unless set
    already; ``extra`` comes last.
    """
    own = {"PYTHONUNBUFFERED": "1"}
    lo = loopback_interface()
    for key, value in (("OMP_NUM_THREADS", "1"),    # what torchrun would set anyway (and print a banner about)
                       ("KINETO_LOG_LEVEL", "6"),   # keep the profiler's start/stop lines out of the output
                       ("GLOO_SOCKET_IFNAME", lo),  # gloo's sockets on loopback (see loopback's docstring)
                       ("NCCL_SOCKET_IFNAME", lo)):  # NCCL's bootstrap sockets too, when a job runs on GPUs
        if value is not None and key not in os.environ:
            own[key] = value
    return fresh.child_env({**own, **(extra or {})})


def parse_result(output: str | Sequence[str]) -> dict[str, Any]:
    """Return the JSON object after the last ``RESULT_MARKER`` in a job's output; ValueError if none.

    ``output`` is the whole text or its lines. The marker may sit anywhere in a line (another rank's
    text can come first), and the JSON value ends where it ends (another rank's text can follow it
    before the newline).
    """
    lines = output.splitlines() if isinstance(output, str) else list(output)
    decoder = json.JSONDecoder()
    for line in reversed(lines):
        at = line.rfind(RESULT_MARKER)
        if at < 0:
            continue
        text = line[at + len(RESULT_MARKER):].lstrip()
        try:
            result, _ = decoder.raw_decode(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"the result line is not JSON: {text[:200]!r}") from err
        if not isinstance(result, dict):
            raise ValueError(f"the result must be a JSON object, got {type(result).__name__}")
        return result
    raise ValueError(f"the job printed no line with {RESULT_MARKER.strip()!r}")


_PROBE = """
import datetime, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=20))
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
dist.destroy_process_group()
print("ok")
"""


def loopback_problem(env: Mapping[str, str] | None = None, timeout_s: float = 120.0) -> str | None:
    """Return None when a one-process gloo group can listen and connect on 127.0.0.1 here, else why not.

    A sandbox without a loopback interface (or with it down) cannot run any job.
    """
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s,
                              env=child_env(env))
    except subprocess.TimeoutExpired:
        return f"a one-process gloo group did not start within {timeout_s:.0f} s"
    if proc.returncode == 0 and "ok" in proc.stdout:
        return None
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"gloo cannot listen on 127.0.0.1 here (is the loopback interface up?): {last}"


def listening_sockets(pids: Iterable[int] | None = None) -> list[tuple[int, str, int]]:
    """Return (pid, address, port) of every listening TCP socket of ``pids``, sorted.

    The default is every process this one started, children of children included (a torchrun
    job's launcher and workers); processes that end meanwhile are skipped.
    """
    import psutil

    if pids is None:
        pids = [p.pid for p in psutil.Process().children(recursive=True)]
    found = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            connections = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6 has the old name
            for conn in connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((pid, str(conn.laddr.ip), int(conn.laddr.port)))
        except psutil.Error:
            continue
    return sorted(found)


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


def run_job(script: str | os.PathLike[str], args: Sequence[Any] = (), *, nproc: int = 2, max_restarts: int = 0,
            timeout_s: float = 300.0, echo: Callable[[str], Any] | None = print,
            env: Mapping[str, str] | None = None, check: bool = True) -> JobResult:
    """Return the result of running ``script`` under torchrun on ``nproc`` processes on loopback, with a timeout.

    ``script`` is a path (relative to the current folder, as a notebook cell's ``%%writefile``
    wrote it). Each output line goes to ``echo`` as it arrives (None: keep quiet). The launcher
    and all its workers are stopped when the call returns or raises. With ``check``, a non-zero
    exit or a missing result raises ``JobError`` with the end of the output.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    path = _script(script).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no job script at {path}: run the cell that writes it (%%writefile) first")
    kind = path.stem
    cmd = torchrun_command(path, args, nproc=nproc, max_restarts=max_restarts)
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
