"""What the fake services of the test kit share: an HTTP server on 127.0.0.1.

Each fake (payments, models) is a real threaded HTTP server bound to the
loopback address, started and stopped from a test or run as a process until
SIGTERM. This module holds that plumbing once; the fakes hold their protocol.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Self


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server on 127.0.0.1 whose handlers reach their service as ``app``."""

    daemon_threads = True

    def __init__(self, port: int, handler: type[BaseHTTPRequestHandler], app: Any) -> None:
        self.app = app
        super().__init__(("127.0.0.1", port), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up mid-answer is normal here (a killed or closed client)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LoopbackService:
    """Start, stop and address a fake service; subclasses give the request handler."""

    handler: type[BaseHTTPRequestHandler]
    thread_name = "fake-service"

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._httpd: LoopbackHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _before_start(self) -> None:
        """Prepare state before the first request (e.g. rebuild it from a log)."""

    def start(self) -> Self:
        """Serve in a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._before_start()
        self._httpd = LoopbackHTTPServer(self.port, self.handler, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # so stop() returns quickly
            name=self.thread_name,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port. Safe to call twice."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def bound_port(self) -> int:
        """The port the server listens on (only while started)."""
        if self._httpd is None:
            raise RuntimeError("server is not running")
        return int(self._httpd.server_address[1])


def serve_until_signal(service: LoopbackService, port_file: str | None) -> int:
    """Run a started service as a process until SIGTERM or SIGINT.

    The bound port is written to ``port_file`` atomically (temp file, fsync,
    rename) so a test in another process can wait for it.
    """
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        if port_file:
            tmp = f"{port_file}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(str(service.bound_port))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, port_file)
        while not done.wait(0.2):
            pass
    finally:
        service.stop()
    return 0
