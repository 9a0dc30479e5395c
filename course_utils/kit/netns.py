"""Can this run with the network really removed? An empty Linux network namespace, loopback only.

``make workshop-check NETNS=1`` runs the readiness check inside ``unshare -n`` (as root) or
``unshare -rn`` (as a user, through a user namespace): a fresh network namespace in which only
loopback exists, so nothing, in any language, can reach another machine. A new namespace starts
with loopback down and Jupyter kernels cannot start without it, so ``python -m
course_utils.kit.netns CMD ...`` brings it up first and then runs CMD.

Where the OS does not allow this (not Linux, no ``unshare``, user namespaces switched off, a
container without the right), ``wrap`` returns None and says why; the check then runs with the
Python guard only (``course_utils.kit.offline``), which catches accidental downloads but is not a
sandbox.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence

# Linux ioctls on an interface's flags (linux/sockios.h, linux/if.h).
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8

#: Run inside the namespace by ``wrap``'s trial: only loopback is up, and it works.
_PROBE = ("import socket; from course_utils.kit import netns; "
          "assert netns.network_removed(), 'an interface other than loopback is up'; "
          "s = socket.create_server(('127.0.0.1', 0)); "
          "socket.create_connection(s.getsockname(), timeout=5).close()")


def _ifreq(name: str, flags: int = 0) -> bytes:
    return struct.pack("16sH22x", name.encode(), flags)  # struct ifreq: name, then ifr_flags


def _flags(sock: socket.socket, name: str) -> int:
    import fcntl

    return struct.unpack_from("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, _ifreq(name)))[1]


def loopback_up() -> None:
    """Return None once loopback is up (needs CAP_NET_ADMIN: root, or root inside ``unshare -r``)."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = _flags(sock, "lo")
        if not flags & _IFF_UP:
            fcntl.ioctl(sock, _SIOCSIFFLAGS, _ifreq("lo", flags | _IFF_UP))


def network_removed() -> bool:
    """Return True when no network interface but loopback is up (always False off Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            flags = _flags(sock, name)
            if flags & _IFF_UP and not flags & _IFF_LOOPBACK:
                return False
    return True


def wrap(python: str = sys.executable) -> tuple[list[str] | None, str]:
    """Return (a command prefix that runs a command in an empty network namespace with loopback
    up, how), or (None, why not) where this machine does not allow one.

    The prefix is tried once (a Python that checks the namespace) before it is returned.
    """
    if not sys.platform.startswith("linux"):
        return None, f"network namespaces are a Linux feature and this is {sys.platform}"
    unshare = shutil.which("unshare")
    if unshare is None:
        return None, "`unshare` (util-linux) is not installed"
    tries = ([[unshare, "-n"]] if os.geteuid() == 0 else []) + [[unshare, "-rn"]]
    why = ""
    for prefix in tries:
        command = [*prefix, python, "-m", "course_utils.kit.netns"]
        try:
            trial = subprocess.run([*command, python, "-c", _PROBE], capture_output=True,
                                   text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            why = str(err)
            continue
        if trial.returncode == 0:
            return command, " ".join(["unshare", *prefix[1:]])
        lines = trial.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {trial.returncode}"
    return None, f"`unshare` cannot make a network namespace here ({why})"


def main(argv: Sequence[str] | None = None) -> int:
    """Bring loopback up, then replace this process with ``argv`` (returns only on failure)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: unshare -rn python -m course_utils.kit.netns CMD [ARGS ...]", file=sys.stderr)
        return 2
    try:
        loopback_up()
    except OSError as err:
        print(f"cannot bring loopback up ({err}); run this inside `unshare -rn`", file=sys.stderr)
        return 1
    os.execvp(argv[0], argv)
    return 1  # not reached: execvp replaces the process or raises


if __name__ == "__main__":
    sys.exit(main())
