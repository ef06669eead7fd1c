"""The offline guard: refuse every network connection, datagram and name lookup that would leave this machine.

The book runs offline (no hub, no dataset download); this guard makes that a checked property instead of a
promise. It is meant to catch an accidental download (a model hub, ``pip``, ``wget`` in a cell), not to contain
hostile code. What it covers, and how:

* **In this Python process** (:func:`install`). Two layers, both refusing any address that is not loopback
  (``127.0.0.0/8``, ``::1``; the names in :data:`LOCAL_NAMES` if they resolve to loopback only) or a Unix socket:

  - :class:`socket.socket`'s ``connect``, ``connect_ex``, ``sendto`` and ``sendmsg`` are patched, so
    :func:`socket.create_connection`, ``urllib``, ``requests``, ``asyncio`` are refused before any system call; a
    refused ``connect`` raises :class:`OfflineError`, a :class:`ConnectionRefusedError`, so libraries that fall
    back to a local cache when the network is down still do, and ``connect_ex`` returns ``ECONNREFUSED``;
  - an audit hook (:func:`sys.addaudithook`, which cannot be removed) sees the C socket methods whatever the
    Python path to them: the base class ``_socket.socket``, ``super().connect``, ``_socket.socket.connect_ex``. It
    also refuses name lookups of anything but loopback names and numeric addresses (``getaddrinfo``,
    ``gethostbyname(_ex)``, ``gethostbyaddr``, ``getnameinfo``): libc's resolver would otherwise send DNS queries
    to the configured nameserver. Host names are never trusted by their spelling (``x.localhost`` is refused).

* **In child Python processes** (``subprocess.run([sys.executable, ...])``, ``pip``): :func:`install` sets
  ``$REPRO_OFFLINE=1`` and puts the folder ``offline_site/`` (a ``sitecustomize`` that installs this guard, then
  runs any ``sitecustomize`` it shadows) first on ``$PYTHONPATH``, so every Python started from a guarded process
  with the inherited environment installs the guard itself at start-up.

* **In the batch runner's kernels, at the OS level.** Where this machine lets the runner create a network
  namespace (:func:`network_isolation`: root, or unprivileged user namespaces on Linux), papermill and its kernel
  run in a new, empty one whose only interface is loopback (:func:`isolate_network`): nothing at all (a C
  library, ``curl``, a child started with a scrubbed environment) can reach another machine, while the kernel's
  own ZeroMQ channels, on loopback, work. ``REPRO_NO_NETNS=1`` opts out.

What is *not* guarded: without the namespace (macOS, Windows, containers that forbid it), programs that are not
Python (``curl``, ``wget``, a compiled extension's own sockets) and Pythons started with ``-I``/``-S``/``-E`` or an
``env=`` without the inherited ``$PYTHONPATH``/``$REPRO_OFFLINE``; a C extension that resolves names itself (the
audit hook sees only Python's socket module); the host part of a ``connect`` on the raw C socket class is
resolved by libc before the audit hook refuses it. ZeroMQ's sockets (the kernel's channels) live in libzmq,
below Python's ``socket`` module, and connect to loopback.

``repro.runtime.setup`` installs the guard when ``$REPRO_OFFLINE`` is set (``1``); the repository's
``conftest.py`` sets it, and the batch runner sets it for every quick-mode kernel whatever the caller's environment
says (full mode keeps the caller's value, default ``1``).

Imports no torch (only the standard library: :mod:`offline_site` loads this file by path).
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ENV = "REPRO_OFFLINE"
NETNS_ENV = "REPRO_NETNS"  # set by the runner for papermill: "1" = enter an empty network namespace first
NETNS_OFF_ENV = "REPRO_NO_NETNS"  # "1": the runner does not use a network namespace
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
SITE_DIR = Path(__file__).resolve().parent / "offline_site"  # the sitecustomize child Pythons pick up

# The guard's state lives on the socket module, so that every copy of this file in a process (repro.tools.offline,
# and the one offline_site loads by path) sees the same guard.
_STATE: dict[str, Any] = socket.__dict__.setdefault(
    "_repro_offline_state", {"original": {}, "refused": [], "active": False, "hook": False, "environ": None})
_original: dict[str, Any] = _STATE["original"]
refused: list[str] = _STATE["refused"]  # every refused address or name, in order (for diagnostics and tests)


class OfflineError(ConnectionRefusedError):
    """A connection to a non-loopback address (or a lookup of a name), refused by the offline guard."""


def requested(env: dict[str, str] | None = None) -> bool:
    """True when ``$REPRO_OFFLINE`` (in ``env``, default this process's) asks for the guard (any value but empty,
    ``0``, ``false``, ``no``)."""
    value = (os.environ if env is None else env).get(ENV, "")
    return value.strip().lower() not in ("", "0", "false", "no")


def _host(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value.strip().rstrip(".").lower() if isinstance(value, str) else None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip


def _resolves_to_loopback(name: str) -> bool:
    """Whether a name of :data:`LOCAL_NAMES` resolves to loopback addresses only (``/etc/hosts`` could say else)."""
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    ips = [_ip(str(info[4][0])) for info in infos]
    return bool(ips) and all(ip is not None and ip.is_loopback for ip in ips)


def is_loopback(family: int, address: Any) -> bool:
    """Whether ``address`` (as passed to ``socket.connect`` for ``family``) stays on this machine.

    Unix sockets always do; an IPv4/IPv6 address does when it is a loopback literal (``127.0.0.0/8``, ``::1``,
    ``::ffff:127.0.0.1``) or one of the names in :data:`LOCAL_NAMES` that resolves to loopback only. Any other host
    name counts as outside and is not resolved (a lookup would itself reach the network)."""
    if family == getattr(socket, "AF_UNIX", object()):
        return True
    if family not in (socket.AF_INET, socket.AF_INET6):
        return False  # packet, netlink, bluetooth...: nothing the book needs
    if not isinstance(address, tuple) or not address:
        return False
    host = _host(address[0])
    if host is None:
        return False
    if host in LOCAL_NAMES:
        return _resolves_to_loopback(host)
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def _may_resolve(name: Any) -> bool:
    """Whether looking ``name`` up stays on this machine: a loopback name, a numeric address, or no name."""
    host = _host(name)
    if name is None or host == "":
        return True
    return host is not None and (host in LOCAL_NAMES or _ip(host) is not None)


def _describe(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return repr(address)


def _refuse(address: Any, what: str = "a connection to") -> OfflineError:
    where = _describe(address) if what == "a connection to" else str(_host(address) or address)
    refused.append(where)
    return OfflineError(
        errno.ECONNREFUSED,
        f"offline guard: refused {what} {where}. The book runs offline (${ENV} is set): data and models "
        "must come from generated data, a pinned package or a prepared local asset (python -m repro prepare)",
    )


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """The audit hook: the C socket calls, whatever Python path led to them (see the module docstring)."""
    if not _STATE["active"] or not event.startswith("socket."):
        return
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[1]
        if address is not None and not is_loopback(sock.family, address):
            raise _refuse(address)
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
        if not _may_resolve(args[0]):
            raise _refuse(args[0], "a name lookup of")
    elif event in ("socket.gethostbyaddr", "socket.getnameinfo"):  # reverse lookups: loopback only
        addr = args[0][0] if isinstance(args[0], tuple) and args[0] else args[0]
        host = _host(addr)
        ip = _ip(host) if host else None
        if not (host in LOCAL_NAMES or (ip is not None and ip.is_loopback)):
            raise _refuse(addr, "a reverse lookup of")


def _patch_methods() -> None:
    cls = socket.socket
    _original.update(connect=cls.connect, connect_ex=cls.connect_ex, sendto=cls.sendto, sendmsg=cls.sendmsg)

    def connect(self: socket.socket, address: Any) -> None:
        if not is_loopback(self.family, address):
            raise _refuse(address)
        return _original["connect"](self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not is_loopback(self.family, address):
            _refuse(address)
            return errno.ECONNREFUSED
        return _original["connect_ex"](self, address)

    def sendto(self: socket.socket, data: Any, *args: Any) -> int:
        address = args[-1] if args else None  # sendto(data, address) or sendto(data, flags, address)
        if address is not None and not is_loopback(self.family, address):
            raise _refuse(address)
        return _original["sendto"](self, data, *args)

    def sendmsg(self: socket.socket, buffers: Any, *args: Any) -> int:
        address = args[2] if len(args) >= 3 else None  # sendmsg(buffers, ancdata, flags, address)
        if address is not None and not is_loopback(self.family, address):
            raise _refuse(address)
        return _original["sendmsg"](self, buffers, *args)

    cls.connect, cls.connect_ex, cls.sendto, cls.sendmsg = (  # type: ignore[method-assign]
        connect, connect_ex, sendto, sendmsg)


def _guard_children() -> None:
    """Make Python processes started from here with this environment install the guard (``offline_site``)."""
    _STATE["environ"] = {k: os.environ.get(k) for k in (ENV, "PYTHONPATH")}
    os.environ[ENV] = "1"
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if (SITE_DIR / "sitecustomize.py").is_file() and str(SITE_DIR) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *entries])


def install() -> None:
    """Refuse non-loopback connections and lookups in this process and in the Python processes it starts from now
    on (idempotent; see the module docstring)."""
    if _STATE["active"]:
        return
    _patch_methods()
    if not _STATE["hook"]:
        sys.addaudithook(_audit)
        _STATE["hook"] = True
    _STATE["active"] = True
    _guard_children()


def uninstall() -> None:
    """Restore the original socket methods and environment; the audit hook stays but lets everything through (the
    tests use it; notebooks keep the guard)."""
    if not _STATE["active"]:
        return
    cls = socket.socket
    cls.connect, cls.connect_ex, cls.sendto, cls.sendmsg = (  # type: ignore[method-assign]
        _original["connect"], _original["connect_ex"], _original["sendto"], _original["sendmsg"])
    _original.clear()
    _STATE["active"] = False
    for key, value in (_STATE["environ"] or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def installed() -> bool:
    """Whether the guard is active in this process."""
    return bool(_STATE["active"])


def install_if_requested() -> bool:
    """Install the guard if ``$REPRO_OFFLINE`` asks for it; return whether it is active."""
    if requested():
        install()
    return installed()


# ---------------------------------------------------------------------------------------------------------
# The OS-level guard: an empty network namespace (Linux)

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    """Bring the interface ``lo`` of this network namespace up (a new namespace starts with it down)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def isolate_network() -> None:
    """Move this process (single-threaded, before it starts anything) into a new network namespace whose only
    interface is loopback, up: ``unshare(CLONE_NEWNET)``, or with a new user namespace that maps this user and
    group onto themselves where that needs no privilege. Its children inherit it. ``OSError`` if this machine does
    not allow it (then nothing changed)."""
    if not sys.platform.startswith("linux"):
        raise OSError(errno.ENOSYS, "network namespaces need Linux")
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        first = ctypes.get_errno()
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(first)}; in a new user namespace: "
                               f"{os.strerror(err)}")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    _loopback_up()


@functools.cache
def network_isolation() -> str | None:
    """``None`` if :func:`isolate_network` works on this machine (tried once, in a throw-away child process), else
    why not: the batch runner then relies on the in-process guard alone."""
    try:
        out = subprocess.run([sys.executable, "-I", str(Path(__file__).resolve()), "--isolate"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the probe did not run ({e})"
    if out.returncode == 0 and out.stdout.strip() == "isolated":
        return None
    return (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]


def _probe() -> int:
    """``python offline.py --isolate``: isolate, check that only loopback is left, say so."""
    try:
        isolate_network()
        names = [name for _, name in socket.if_nameindex()]
    except OSError as e:
        print(f"no network namespace: {e}", file=sys.stderr)
        return 1
    if names != ["lo"]:
        print(f"the new network namespace has interfaces {names}", file=sys.stderr)
        return 1
    print("isolated")
    return 0


if __name__ == "__main__" and sys.argv[1:] == ["--isolate"]:
    sys.exit(_probe())
