"""The offline guard (repro.tools.offline): outside connections are refused with a clear error, loopback (a local
socket server) and Unix sockets still work, and runtime.setup installs it when $REPRO_OFFLINE asks."""

from __future__ import annotations

import errno
import socket
import threading

import pytest

from repro import runtime
from repro.tools import offline

OUTSIDE = ("192.0.2.1", 80)  # TEST-NET-1 (RFC 5737): never routed, so nothing is reached even without the guard


@pytest.fixture
def guard():
    """The guard installed for one test; the process's earlier state is restored after it."""
    was = offline.installed()
    offline.install()
    offline.refused.clear()
    yield offline
    if not was:
        offline.uninstall()


def echo_server(family: int = socket.AF_INET, host: str = "127.0.0.1"):
    """A one-connection echo server on loopback; returns its address and the serving thread."""
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.bind((host, 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(64).upper())
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[:2], t


def test_outside_connections_are_refused_with_a_clear_error(guard):
    with pytest.raises(offline.OfflineError, match=r"offline guard: refused a connection to 192\.0\.2\.1:80"):
        socket.create_connection(OUTSIDE, timeout=2)
    s = socket.socket()
    with pytest.raises(ConnectionRefusedError, match="REPRO_OFFLINE"):  # libraries' fallbacks catch OSError
        s.connect(("example.com", 443))  # a host name is refused without being resolved
    assert s.connect_ex(OUTSIDE) == errno.ECONNREFUSED  # connect_ex reports, as its contract says
    s.close()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with pytest.raises(offline.OfflineError):
        u.sendto(b"x", ("8.8.8.8", 53))
    u.close()
    assert guard.refused == ["192.0.2.1:80", "example.com:443", "192.0.2.1:80", "8.8.8.8:53"]


def test_loopback_and_unix_sockets_still_work(guard, tmp_path):
    (host, port), t = echo_server()
    with socket.create_connection((host, port), timeout=10) as c:  # through the patched connect
        c.sendall(b"ping")
        assert c.recv(64) == b"PING"
    t.join(10)
    (host, port), t = echo_server()
    with socket.create_connection(("localhost", port), timeout=10) as c:
        c.sendall(b"name")
        assert c.recv(64) == b"NAME"
    t.join(10)
    path = str(tmp_path / "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cli.connect(path)
    cli.close()
    srv.close()
    assert guard.refused == []


def test_loopback_rules():
    assert offline.is_loopback(socket.AF_INET, ("127.0.0.1", 1))
    assert offline.is_loopback(socket.AF_INET, ("127.3.2.1", 1))
    assert offline.is_loopback(socket.AF_INET6, ("::1", 1, 0, 0))
    assert offline.is_loopback(socket.AF_INET6, ("::ffff:127.0.0.1", 1, 0, 0))
    assert offline.is_loopback(socket.AF_INET, ("LocalHost.", 1))
    assert not offline.is_loopback(socket.AF_INET, ("10.0.0.1", 1))
    assert not offline.is_loopback(socket.AF_INET, ("0.0.0.0", 1))
    assert not offline.is_loopback(socket.AF_INET6, ("::ffff:8.8.8.8", 1, 0, 0))
    assert not offline.is_loopback(socket.AF_INET, ("localhost.example.com", 1))


def test_uninstall_restores_the_socket_methods():
    was = offline.installed()
    offline.uninstall()
    original = socket.socket.connect
    offline.install()
    offline.install()  # idempotent: the second call must not wrap the wrapper
    assert socket.socket.connect is not original and offline.installed()
    offline.uninstall()
    assert socket.socket.connect is original and not offline.installed()
    if was:
        offline.install()


def test_runtime_setup_installs_the_guard_when_asked(monkeypatch):
    was = offline.installed()
    offline.uninstall()
    try:
        monkeypatch.setenv(offline.ENV, "0")
        runtime.setup("99-test", "quick", device_name="cpu")
        assert not offline.installed()
        monkeypatch.setenv(offline.ENV, "1")
        runtime.setup("99-test", "quick", device_name="cpu")
        assert offline.installed()
        with pytest.raises(offline.OfflineError):
            socket.create_connection(OUTSIDE, timeout=2)
    finally:
        offline.uninstall()
        if was:
            offline.install()
