"""The offline guard (repro.tools.offline): outside connections are refused with a clear error, loopback (a local
socket server) and Unix sockets still work, and runtime.setup installs it when $REPRO_OFFLINE asks. Issue 35 (D7):
the paths that got past it (sendmsg, the C socket class, DNS, *.localhost names, child Pythons) are refused too;
the runner's kernels are guarded whatever the caller's $REPRO_OFFLINE says, and run in an empty network namespace
where the machine allows one."""

from __future__ import annotations

import _socket
import errno
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from repro import runtime
from repro.tools import offline

OUTSIDE = ("192.0.2.1", 80)  # TEST-NET-1 (RFC 5737): never routed, so nothing is reached even without the guard
# Not loopback for the guard, yet a datagram or connect that got past it stays on this machine (Linux sends 0.0.0.0
# to itself): the bypass tests below can fail without anything leaving the machine.
HERE_BUT_NOT_LOOPBACK = ("0.0.0.0", 9)


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


def test_the_paths_that_got_past_the_guard_are_refused(guard):
    """D7 (probes 3.4, 3.11-3.14, 3.17): sendmsg, the C base class _socket.socket, super().connect, the C
    connect_ex, DNS and reverse lookups, and names under .localhost reached a syscall or the nameserver."""
    T = HERE_BUT_NOT_LOOPBACK
    attempts = {
        "sendmsg": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b"x"], [], 0, T),
        "C class": lambda: _socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(T),
        "super()": lambda: super(socket.socket, socket.socket()).connect(T),
        "C connect_ex": lambda: _socket.socket.connect_ex(socket.socket(), T),
        "C sendto": lambda: _socket.socket.sendto(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), b"x", T),
        "DNS": lambda: socket.getaddrinfo("repro-probe.invalid", 80),
        "gethostbyname": lambda: socket.gethostbyname("repro-probe.invalid"),
        "reverse DNS": lambda: socket.gethostbyaddr("8.8.8.8"),
        ".localhost": lambda: socket.socket().connect(("probe.localhost", 9)),
    }
    for name, attempt in attempts.items():
        with pytest.raises(offline.OfflineError, match="offline guard: refused"):
            attempt()
            pytest.fail(f"{name} got past the guard")
    assert "repro-probe.invalid" in guard.refused and "8.8.8.8" in guard.refused
    assert not offline.is_loopback(socket.AF_INET, ("probe.localhost", 9))  # a name is not trusted by its spelling
    assert socket.getaddrinfo("localhost", 80) and socket.getaddrinfo("127.0.0.1", 80)  # no lookup leaves here


def test_child_pythons_inherit_the_guard(guard):
    """D7 (probe 3.15): a child Python inherited $REPRO_OFFLINE=1 but never installed the guard."""
    code = "import socket; socket.create_connection(('0.0.0.0', 9), timeout=5)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "OfflineError" in out.stderr and "offline guard: refused a connection" in out.stderr
    assert os.environ[offline.ENV] == "1" and str(offline.SITE_DIR) in os.environ["PYTHONPATH"].split(os.pathsep)


def test_uninstall_restores_the_environment():
    was = offline.installed()
    offline.uninstall()
    before = {k: os.environ.get(k) for k in (offline.ENV, "PYTHONPATH")}
    try:
        offline.install()
        assert str(offline.SITE_DIR) in os.environ["PYTHONPATH"]
        offline.uninstall()
        assert {k: os.environ.get(k) for k in (offline.ENV, "PYTHONPATH")} == before
    finally:
        if was:
            offline.install()


NET = ("from repro import runtime\nfrom repro.tools import offline\nrun = runtime.setup('{stem}', MODE, SEED, 'cpu')\n"
       "import json, os, socket, subprocess, sys\n"
       "child = subprocess.run([sys.executable, '-c', \"import socket; socket.create_connection(('0.0.0.0', 9), "
       "timeout=5)\"], capture_output=True, text=True)\n"
       "json.dump(dict(installed=offline.installed(), netns=os.readlink('/proc/self/ns/net'),\n"
       "               ifaces=[n for _, n in socket.if_nameindex()], child=child.stderr), open('net.json', 'w'))")


def test_runner_kernels_are_guarded_whatever_the_callers_environment(tmp_path, monkeypatch):
    """D7 (probe 3.20): REPRO_OFFLINE=0 in the caller's environment left quick-mode kernels unguarded (the runner
    only did setdefault). Where this machine allows an empty network namespace, kernels run in one (only lo)."""
    from fixture_notebooks import make_notebook

    from repro.tools import batch

    (tmp_path / "results").mkdir()
    make_notebook(tmp_path, "01-net", NET)
    monkeypatch.setenv(offline.ENV, "0")
    [out] = batch.run(tmp_path, "quick", progress=False)
    assert out.status == "ok", out.error
    info = json.loads((tmp_path / "notebooks" / "net.json").read_text())
    assert info["installed"] and "offline guard: refused a connection" in info["child"]
    if offline.network_isolation() is None:
        assert info["netns"] != os.readlink("/proc/self/ns/net") and info["ifaces"] == ["lo"]
    else:
        assert info["netns"] == os.readlink("/proc/self/ns/net")  # in-process guard only: said in the docstring
