"""The bridge server: the loopback TCP socket through which the host reaches a simulated design.

Runs inside the simulator (cocotb's embedded Python), started by
:class:`~pipetrain.sim.bridge.SimBridge`; both ``sim`` targets use it — the word-stream bridge
(:mod:`pipetrain.sim.cocotb_bridge`) and the UART-level one (:mod:`pipetrain.sim.cocotb_uart`).
They differ only in how bytes reach the design's ports and when the clock may stop; the socket
side is :class:`LinkServer`.

Protocol with :class:`~pipetrain.sim.bridge.SimBridge` (job keys): the server listens on
``127.0.0.1`` (``port``, 0 = any free one), writes ``{"port", "pid"}`` to ``port_file`` (an
atomic rename: the host polls for it), accepts one connection within ``accept_timeout_s``
seconds and serves it until the host closes it or the host process (``parent_pid``) dies.
While the design has nothing to do the bench blocks in :meth:`LinkServer.wait` with the clock
stopped (simulated time does not advance while nothing can happen; docs/architecture.md §6).
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import cocotb

__all__ = ["Closed", "LinkServer"]


class Closed(Exception):
    """The host closed the connection, or its process is gone."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, owned by another user
        return True
    return True


class LinkServer:
    """One host connection on a loopback TCP port, served from inside the simulator.

    Parameters
    ----------
    job: the bridge job (keys ``port``, ``port_file``, ``accept_timeout_s``, ``parent_pid``;
        see the module docstring).

    Members
    -------
    port: the port listened on (after :meth:`accept`).
    bytes_in, bytes_out: bytes received from / sent to the host.
    blocked_s: seconds spent in :meth:`wait` (the clock stopped).
    error: an exception a bench recorded with :meth:`fail`; :meth:`recv` and :meth:`serve`
        raise it.
    """

    def __init__(self, job: dict[str, Any]) -> None:
        self.requested_port = int(job.get("port", 0))
        self.port_file = str(job["port_file"])
        self.accept_timeout_s = float(job.get("accept_timeout_s", 60.0))
        self.parent = int(job.get("parent_pid", 0))
        self.conn: socket.socket | None = None
        self.port: int | None = None
        self.bytes_in = self.bytes_out = 0
        self.blocked_s = 0.0
        self.serve_s = 0.0
        self.error: BaseException | None = None
        self._peer_gone = False

    def accept(self) -> None:
        """Listen, publish the port in ``port_file`` and wait for the host to connect.

        Raises :class:`TimeoutError` naming the port when no host connects within
        ``accept_timeout_s`` seconds.
        """
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.requested_port))
        srv.listen(1)
        self.port = srv.getsockname()[1]
        tmp = f"{self.port_file}.tmp"
        with open(tmp, "w") as f:
            json.dump({"port": self.port, "pid": os.getpid()}, f)
        os.replace(tmp, self.port_file)
        srv.settimeout(self.accept_timeout_s)
        try:
            self.conn, _ = srv.accept()
        except TimeoutError as exc:
            raise TimeoutError(
                f"no host connected to 127.0.0.1:{self.port} within {self.accept_timeout_s} s"
            ) from exc
        finally:
            srv.close()
        self.conn.setblocking(True)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def recv(self) -> bytes:
        """Return the host bytes available now (``b""`` if none; never blocks).

        Raises :attr:`error` when a bench recorded one, :class:`Closed` when the host has
        closed the connection (or a send found it gone).
        """
        if self.error is not None:
            raise self.error
        if self._peer_gone:
            raise Closed
        assert self.conn is not None
        try:
            data = self.conn.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return b""
        except OSError as exc:  # reset by peer
            raise Closed from exc
        if not data:
            raise Closed
        self.bytes_in += len(data)
        return data

    def send(self, data: bytes) -> None:
        """Send ``data`` to the host; a host that went away ends the session at the next
        :meth:`recv` (:class:`Closed`) instead of failing the bench here."""
        assert self.conn is not None
        try:
            self.conn.sendall(data)
        except OSError:
            self._peer_gone = True
            return
        self.bytes_out += len(data)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block (the clock stopped) until the host sends or ``timeout_s`` seconds pass (None:
        for as long as the host process lives); return whether input is ready.

        Raises :class:`Closed` when the host process (``parent_pid``) has died.
        """
        t = time.perf_counter()
        try:
            while True:
                left = 1.0 if timeout_s is None else max(0.0, t + timeout_s - time.perf_counter())
                r, _, _ = select.select([self.conn], [], [], min(left, 1.0))
                if r:
                    return True
                if self.parent and not _alive(self.parent):
                    raise Closed
                if timeout_s is not None and time.perf_counter() - t >= timeout_s:
                    return False
        finally:
            self.blocked_s += time.perf_counter() - t

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` (e.g. a UART framing error) and shut the connection down, so the host
        sees the link fail; :meth:`serve` re-raises it."""
        self.error = exc
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    async def serve(
        self, feed: Callable[[], Awaitable[None]], drain: Callable[[], Awaitable[None]]
    ) -> None:
        """Accept the host, then run ``drain()`` (design → host) in the background and
        ``feed()`` (host → design) until the host leaves (:class:`Closed`).

        Sets :attr:`serve_s` (seconds from the connection to the end). Raises :attr:`error`
        when a bench recorded one, and what :meth:`accept` raises.
        """
        self.accept()
        assert self.conn is not None
        t = time.perf_counter()
        task = cocotb.start_soon(drain())
        try:
            await feed()
        except Closed:
            pass
        finally:
            task.cancel()
            self.conn.close()
            self.serve_s = time.perf_counter() - t
        if self.error is not None:
            raise self.error

    def stats(self) -> dict[str, Any]:
        """``port``, ``bytes_in``, ``bytes_out``, ``serve_s``, ``blocked_s`` (seconds)."""
        return {
            "port": self.port,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "serve_s": self.serve_s,
            "blocked_s": self.blocked_s,
        }
