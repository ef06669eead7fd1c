"""The runner's client fix (repro.tools.launcher.rearm_asyncio_sends, issue 12): a reply that lands on an asyncio
socket while jupyter_client's Session.send writes on the same socket must still wake the coroutine awaiting it.

The race is made deterministic: the reply arrives (over inproc, so its wake-up is pending on the socket's
edge-triggered ZMQ_FD when the send returns) and, before the event loop looks at the FD, Session.send writes on
the same socket, which consumes that wake-up. This is
what nbclient does when it mimics an Output widget (a comm_msg on the shell channel) while it awaits an
execute_reply."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio
from jupyter_client.session import Session

from repro.tools import launcher


async def _reply_lands_during_a_send(session: Session, poll_ms: int | None = None) -> float | None:
    """Seconds until the awaiting coroutine got the reply (its poll has no timeout, or ``poll_ms``), or ``None``
    if it was still waiting after 3 s."""
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER, socket_class=zmq.Socket)  # the kernel's side, a plain socket
    dealer = ctx.socket(zmq.DEALER)  # the client's shell channel, as jupyter_client makes it
    try:
        # inproc: the reply is in the dealer's pipe, its wake-up pending, as soon as router.send returns
        router.bind("inproc://shell")
        dealer.connect("inproc://shell")
        await dealer.send(b"execute_request")
        ident, _ = router.recv_multipart()
        waiter = asyncio.ensure_future(dealer.poll(poll_ms))  # nbclient awaiting the execute_reply
        await asyncio.sleep(0.1)  # the poll is armed on the FD
        router.send_multipart([ident, b"execute_reply"])  # lands while the loop is busy elsewhere
        start = asyncio.get_running_loop().time()
        session.send(dealer, "comm_msg", {"data": {}})  # the Output-widget mimic, on the same socket
        try:
            await asyncio.wait_for(asyncio.shield(waiter), 3)
        except TimeoutError:
            waiter.cancel()
            return None
        assert waiter.result() & zmq.POLLIN and await dealer.recv() == b"execute_reply"
        return asyncio.get_running_loop().time() - start
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()


def test_the_reply_wakes_its_waiter_with_the_fix(monkeypatch):
    monkeypatch.setattr(Session, "send", Session.send)  # restored after the test
    launcher.rearm_asyncio_sends()
    launcher.rearm_asyncio_sends()  # idempotent
    assert getattr(Session.send, "_repro_rearms", False)
    seconds = asyncio.run(_reply_lands_during_a_send(Session(key=b"k")))
    assert seconds is not None and seconds < 0.5


def test_without_the_fix_the_reply_is_stranded(monkeypatch):
    """The upstream bug the fix works around (jupyter_client >= 8 sends on a sync shadow of the asyncio socket).
    A canary: when an upgrade makes this fail, the upstream bug is gone and rearm_asyncio_sends can go."""
    monkeypatch.setattr(Session, "send", Session.send)
    if getattr(Session.send, "_repro_rearms", False):
        pytest.skip("Session.send is patched in this process")
    assert asyncio.run(_reply_lands_during_a_send(Session(key=b"k"))) is None, \
        "the reply woke its waiter without the fix: this jupyter_client/pyzmq no longer loses it"


def test_a_cell_timeout_turns_the_lost_wakeup_into_a_delay(monkeypatch):
    """Without the fix, a poll with a timeout (nbclient's with a per-cell timeout) finds the stranded reply at its
    deadline (pyzmq polls the socket itself then): the runner's --cell-timeout bounds such a stall."""
    monkeypatch.setattr(Session, "send", Session.send)
    if getattr(Session.send, "_repro_rearms", False):
        pytest.skip("Session.send is patched in this process")
    seconds = asyncio.run(_reply_lands_during_a_send(Session(key=b"k"), poll_ms=1000))
    assert seconds is not None and 0.8 < seconds < 2.5
