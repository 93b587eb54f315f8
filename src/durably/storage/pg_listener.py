"""PostgreSQL's wake-ups: a thread holding a LISTEN connection, for the PostgreSQL store.

A notification names what changed (new work, a signal, a cancel, a timer); the
engine acts on it at once instead of at its next poll. Once its LISTEN holds, the
first time and after a lost connection (connected again), the listener reports
"work": what was sent before it listened reached no one.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql as pgsql

from durably import loop_errors
from durably.storage import base, sqlbase

log = logging.getLogger("durably")


def use_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Point the (autocommit) session's unqualified names at ``schema``, and only there."""
    conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(schema)))


class Listener:
    """A thread holding a LISTEN connection; hands every notification to a callback.

    It waits in a selector on the connection's socket and on a pipe that
    :meth:`stop` writes to, so stopping is immediate. A quiet connection is
    checked every ``keepalive`` seconds; a lost one is replaced with back-off, and so
    is one that met an error other than psycopg's (logged once per kind).
    """

    def __init__(
        self,
        conninfo: str,
        where: str,
        callback: Callable[[base.Wakeup], None],
        channel: str,
        schema: str,
        keepalive: float = 15.0,
    ) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._schema = schema
        self._where = where
        self._callback = callback
        self._keepalive = keepalive
        self._stop_r, self._stop_w = os.pipe()
        self._stopped = threading.Event()
        self._unexpected = loop_errors.LoopErrors(f"the wake-up listener of {where}")
        self._thread = threading.Thread(target=self._run, name="durably-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and wait for the thread. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        os.write(self._stop_w, b"x")
        self._thread.join()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _run(self) -> None:
        delay = 0.1
        while not self._stopped.is_set():
            try:
                delay = self._listen(delay)
            except Exception as exc:  # not psycopg's (an OSError, a bug): listen again
                self._pause(self._unexpected.failed(exc))

    def _listen(self, delay: float) -> float:
        """Connect, LISTEN and serve until the connection is lost (psycopg's errors end
        here, after a pause of ``delay``) or the listener stops; the next delay."""
        try:
            # UTF-8 whatever the database's encoding: a payload holding an id of
            # non-ASCII text (a join's, built by the server) decodes as sent.
            conn = psycopg.connect(self._conninfo, autocommit=True, client_encoding="utf8")
        except psycopg.Error as exc:
            log.info("cannot listen on %s yet: %s", self._where, " ".join(str(exc).split()))
            self._pause(delay)
            return min(delay * 2, 2.0)
        try:
            use_schema(conn, self._schema)
            conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self._channel)))
            delay = 0.1
            # What was sent before this LISTEN (while connecting, the first time too:
            # after the engine's first pass) is lost: a pass now looks for it.
            self._deliver(base.Wakeup("work"))
            self._serve(conn)
        except psycopg.Error as exc:
            log.info("lost the wake-up connection to %s: %s", self._where, exc)
            self._pause(delay)
        finally:
            conn.close()
        return delay

    def _serve(self, conn: psycopg.Connection[Any]) -> None:
        conn.add_notify_handler(lambda n: self._deliver(sqlbase.decode_wakeup(n.payload)))
        with _waiting_on(conn.fileno(), self._stop_r) as waiting:
            self._hear(conn, waiting)

    def _hear(self, conn: psycopg.Connection[Any], waiting: selectors.BaseSelector) -> None:
        """Deliver the notifications ``conn`` hears until stopped; a keepalive when quiet."""
        while not self._stopped.is_set():
            ready = [key.fd for key, _ in waiting.select(self._keepalive)]
            if self._stop_r in ready:
                return
            if not ready:
                conn.execute("SELECT 1")  # raises if the server went away silently
            else:
                conn.pgconn.consume_input()  # raises if the connection was closed
                while (notify := conn.pgconn.notifies()) is not None:
                    payload = notify.extra.decode("utf-8", "replace")
                    self._deliver(sqlbase.decode_wakeup(payload))
            self._unexpected.succeeded()  # (not at LISTEN: an error each wait would spin)

    def _deliver(self, wakeup: base.Wakeup) -> None:
        try:
            self._callback(wakeup)
        except Exception:  # the engine's problem; never the end of listening
            log.exception("wake-up callback failed")

    def _pause(self, seconds: float) -> None:
        self._stopped.wait(seconds)  # set by stop() before it writes the pipe


def _waiting_on(*fds: int) -> selectors.BaseSelector:
    """A selector on ``fds``, readable: epoll or poll, not ``select``, which refuses a
    descriptor past 1024 (a process with a thousand files open gives the listener one)."""
    waiting = selectors.DefaultSelector()
    for fd in fds:
        waiting.register(fd, selectors.EVENT_READ)
    return waiting
