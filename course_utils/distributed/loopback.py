"""torchrun with every listening socket of the job on loopback: ``python -m course_utils.distributed.loopback ARGS``.

``ARGS`` are torchrun's own (``--nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P
... script.py``); ``launch.torchrun_command`` builds them. This module changes one thing before it
hands over to ``torch.distributed.run.main``: where the job's key-value stores listen.

What torchrun binds, one machine, c10d rendezvous (read in torch 2.14.1's
``torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py`` and ``dynamic_rendezvous.py``,
and seen with ``ss -ltnp`` during a job):

- the agent (the torchrun process) hosts the rendezvous ``TCPStore`` on the ``--rdzv-endpoint``
  port, and, because workers share the agent's store by default
  (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` unset), a second ``TCPStore`` on a port the system picks,
  which the workers reach through ``MASTER_ADDR``/``MASTER_PORT``;
- a ``TCPStore`` server listens on every interface (``*``, IPv4 and IPv6) whatever host name it is
  given: ``--rdzv-endpoint 127.0.0.1:P``, ``--local-addr 127.0.0.1``, ``--master-addr 127.0.0.1``
  (the static rendezvous) and ``--standalone`` all leave it reachable from the network, and the
  store has no authentication. No torchrun option or ``TORCH_*`` variable changes that;
- the store's constructor does take ``master_listen_fd``: a socket that already listens. Here every
  ``TCPStore`` server the agent starts gets a socket bound to the loopback address it was asked
  for (127.0.0.1 or ::1), and a non-loopback address is refused;
- each worker's gloo connections listen on the address of one interface: the one named by
  ``GLOO_SOCKET_IFNAME`` if set, otherwise the address the machine's host name resolves to (often
  127.0.1.1, but the LAN address on some machines). This module sets it to the loopback interface
  (``lo`` on Linux, ``lo0`` on macOS) when it is not set, and ``NCCL_SOCKET_IFNAME`` likewise for
  NCCL's bootstrap sockets on GPUs (one machine: NCCL's data goes through shared memory or NVLink);
- the static rendezvous (``--master-addr 127.0.0.1 --master-port P``) hosts one store, also on
  ``*`` in plain torchrun and on 127.0.0.1 here;
- nothing else listens (no health-check port unless ``TORCHELASTIC_HEALTH_CHECK_PORT`` is set).

``tests/test_distributed.py`` runs a job and checks the address of every listening socket of the
launcher and its workers.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

#: TCPStore's constructor arguments, in order (torch/_C/_distributed_c10d.pyi).
_STORE_ARGS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers",
               "multi_tenant", "master_listen_fd", "use_libuv")


def is_loopback(host: str) -> bool:
    """Return True for ``localhost`` and for addresses in 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_interface() -> str | None:
    """Return the name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS and BSD), None if unknown."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def listen_on(host: str, port: int) -> socket.socket:
    """Return a TCP socket listening on ``host``:``port`` (``port`` 0: the system picks); ValueError off loopback."""
    if not is_loopback(host):
        raise ValueError(f"refusing to host the job's store on {host!r}: only loopback addresses are allowed here")
    address = host.strip("[]") if host != "localhost" else "127.0.0.1"
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        return socket.create_server((address, port), family=family, backlog=1024)
    except OSError as err:  # the store raises RuntimeError when its port is taken; keep that contract
        raise RuntimeError(f"cannot listen on {address}:{port}: {err}") from err


def loopback_store_class() -> type:
    """Return a ``torch.distributed.TCPStore`` subclass whose servers listen on loopback only."""
    import torch.distributed as dist

    class LoopbackTCPStore(dist.TCPStore):  # type: ignore[misc, name-defined]
        """A TCPStore that, when it hosts the store, listens on the loopback address it was given."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given = dict(zip(_STORE_ARGS, args, strict=False)) | kwargs
            if given.get("is_master") and given.get("master_listen_fd") is None:
                sock = listen_on(str(given["host_name"]), int(given.get("port", 0)))
                given["port"] = sock.getsockname()[1]
                given["master_listen_fd"] = sock.detach()  # the store owns the descriptor from here on
                try:
                    super().__init__(**given)
                except BaseException:
                    os.close(given["master_listen_fd"])
                    raise
            else:
                super().__init__(**given)

    return LoopbackTCPStore


def install() -> list[str]:
    """Return the modules whose ``TCPStore`` now is the loopback one (torch's own and the rendezvous modules)."""
    import importlib

    import torch.distributed as dist

    store = loopback_store_class()
    patched = []
    for name in ("torch.distributed", "torch.distributed.rendezvous",
                 "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
                 "torch.distributed.elastic.rendezvous.static_tcp_rendezvous"):
        module = importlib.import_module(name)
        if getattr(module, "TCPStore", None) is not None:
            module.TCPStore = store  # type: ignore[attr-defined]
            patched.append(name)
    assert dist.TCPStore is store
    return patched


def main(argv: Sequence[str] | None = None) -> None:
    """Run torchrun with ``argv`` (default: this process's arguments), its stores and gloo on loopback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    lo = loopback_interface()
    if lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)  # the workers inherit both
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    install()
    from torch.distributed import run

    run.main(argv)


if __name__ == "__main__":
    main()
