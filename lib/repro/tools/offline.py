"""The offline guard: refuse every network connection that leaves this machine.

The book runs offline (no hub, no dataset download); this guard makes that a checked property instead of a
promise. :func:`install` patches :class:`socket.socket` so that ``connect``, ``connect_ex`` and ``sendto`` (and
therefore :func:`socket.create_connection`, ``urllib``, ``requests``, ``asyncio``) refuse any address that is not
loopback (``127.0.0.0/8``, ``::1``, ``localhost``) or a Unix socket. A refused ``connect`` raises
:class:`OfflineError`, a :class:`ConnectionRefusedError`, so libraries that fall back to a local cache when the
network is down still do; ``connect_ex`` returns ``ECONNREFUSED`` as its contract says. Name resolution
(``getaddrinfo``) is left alone: it reaches no peer by itself.

``repro.runtime.setup`` installs the guard when ``$REPRO_OFFLINE`` is set (``1``); the repository's
``conftest.py`` and the batch runner set it, so every notebook they execute runs guarded. ZeroMQ's own sockets
(the kernel's channels) live in libzmq, below Python's ``socket`` module, and all connect to loopback anyway.

Imports no torch.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from typing import Any

ENV = "REPRO_OFFLINE"
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

_original: dict[str, Any] = {}
refused: list[str] = []  # every refused address, in order (for diagnostics and tests)


class OfflineError(ConnectionRefusedError):
    """A connection to a non-loopback address, refused by the offline guard."""


def requested() -> bool:
    """True when ``$REPRO_OFFLINE`` asks for the guard (any value but empty, ``0``, ``false``, ``no``)."""
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


def is_loopback(family: int, address: Any) -> bool:
    """Whether ``address`` (as passed to ``socket.connect`` for ``family``) stays on this machine.

    Unix sockets always do; an IPv4/IPv6 address does when it is a loopback literal (``127.0.0.0/8``, ``::1``,
    ``::ffff:127.0.0.1``) or one of the loopback names in :data:`LOCAL_NAMES` (or ``*.localhost``). Any other host
    name counts as outside: it is not resolved (offline, a lookup could itself hang)."""
    if family == getattr(socket, "AF_UNIX", object()):
        return True
    if family not in (socket.AF_INET, socket.AF_INET6):
        return False  # packet, netlink, bluetooth...: nothing the book needs
    if not isinstance(address, tuple) or not address:
        return False
    host = address[0]
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    host = host.strip().rstrip(".").lower()
    if host in LOCAL_NAMES or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _describe(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return repr(address)


def _refuse(address: Any) -> OfflineError:
    where = _describe(address)
    refused.append(where)
    return OfflineError(
        errno.ECONNREFUSED,
        f"offline guard: refused a connection to {where}. The book runs offline (${ENV} is set): data and models "
        "must come from generated data, a pinned package or a prepared local asset (python -m repro prepare)",
    )


def install() -> None:
    """Refuse non-loopback connections in this process from now on (idempotent)."""
    if _original:
        return
    cls = socket.socket
    _original.update(connect=cls.connect, connect_ex=cls.connect_ex, sendto=cls.sendto)

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

    cls.connect, cls.connect_ex, cls.sendto = connect, connect_ex, sendto  # type: ignore[method-assign]


def uninstall() -> None:
    """Restore the original socket methods (the tests use it; notebooks keep the guard)."""
    if not _original:
        return
    cls = socket.socket
    cls.connect, cls.connect_ex, cls.sendto = (  # type: ignore[method-assign]
        _original["connect"], _original["connect_ex"], _original["sendto"])
    _original.clear()


def installed() -> bool:
    """Whether the guard is active in this process."""
    return bool(_original)


def install_if_requested() -> bool:
    """Install the guard if ``$REPRO_OFFLINE`` asks for it; return whether it is active."""
    if requested():
        install()
    return installed()
