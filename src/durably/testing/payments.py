"""A fake payments service that counts real side effects.

:class:`FakePaymentsServer` is a real HTTP server on 127.0.0.1. Every request is
appended as one JSON line to a log file, fsync'd before the response is sent, so
a test counts what actually happened ("two requests, one key, one refund")
instead of trusting the agent's logs. The log is also the server's memory: a
server started on an existing log, even in a new process, keeps deduplicating
keys seen before. Log fields: ``ts, method, path`` (with query string),
``idempotency_key`` (header or None), ``body`` (parsed JSON or None),
``status, refund_id``, ``created`` (True only for a new refund) and ``refund``.

* ``POST /refunds`` ``{"order_id": str, "amount": number | str}``, optional
  ``Idempotency-Key`` header: 200 with the refund, after sleeping ``delay``
  seconds. The refund is created and logged *before* the sleep, so a client
  killed mid-call leaves a real side effect behind. Bad input: 400.
* ``GET /refunds?idempotency_key=K``: 200 with the refund, 404 if none. Only the
  ``"lookup"`` flavour has it; others answer 501 ``{"error": "lookup not supported"}``.
* ``GET /health``: 200 ``{"ok": true}``.

Flavours: ``"idempotent"`` replays the original response for a repeated key (with
header ``Idempotent-Replayed: true``), creating nothing; ``"lookup"`` also has the
lookup endpoint; ``"plain"`` creates a refund on every POST. As a process::

    python -m durably.testing.payments --log PATH [--flavour F] [--port N]
        [--port-file PATH] [--delay SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal, cast

from durably.testing import loopback

__all__ = [
    "FakePaymentsServer",
    "Flavour",
    "PaymentsError",
    "find_refund",
    "read_log",
    "refund",
    "refunds_in_log",
]

Flavour = Literal["idempotent", "lookup", "plain"]
_FLAVOURS: tuple[Flavour, ...] = ("idempotent", "lookup", "plain")
_TIMEOUT = 10.0

JSONDict = dict[str, object]


class PaymentsError(Exception):
    """The payments service answered with an unexpected HTTP status."""

    def __init__(self, status: int, body: object) -> None:
        super().__init__(f"payments service answered HTTP {status}: {body!r}")
        self.status = status
        self.body = body


def read_log(path: str | os.PathLike[str]) -> list[JSONDict]:
    """Return every line of a server's log, parsed, in order.

    A missing file is an empty log. Torn lines (from a process killed mid-write)
    are skipped.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out: list[JSONDict] = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def refunds_in_log(path: str | os.PathLike[str]) -> list[JSONDict]:
    """Return the distinct refunds actually created, in creation order."""
    seen: set[object] = set()
    out: list[JSONDict] = []
    for line in read_log(path):
        made = line.get("refund")
        if line.get("created") is True and isinstance(made, dict) and made["refund_id"] not in seen:
            seen.add(made["refund_id"])
            out.append(cast(JSONDict, made))
    return out


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakePayments/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: the JSONL log is the record."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        app: FakePaymentsServer = cast(loopback.LoopbackHTTPServer, self.server).app
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        key = self.headers.get("Idempotency-Key") or None
        is_refund_post = method == "POST" and urllib.parse.urlsplit(self.path).path == "/refunds"
        if is_refund_post:
            app._enter()
        try:
            status, payload, headers = app._handle(method, self.path, key, raw)
            if is_refund_post and app.delay > 0:
                time.sleep(app.delay)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        finally:
            if is_refund_post:
                app._exit()


class FakePaymentsServer(loopback.LoopbackService):
    """A real HTTP payments service on 127.0.0.1 that logs every request.

    Use as a context manager (``with FakePaymentsServer(path) as srv:``) or call
    :meth:`start` / :meth:`stop`. ``port=0`` picks a free port; see :attr:`url`.
    """

    handler = _Handler
    thread_name = "fake-payments"

    def __init__(
        self,
        log_path: str | os.PathLike[str],
        *,
        flavour: Flavour = "idempotent",
        port: int = 0,
        delay: float = 0.0,
    ) -> None:
        if flavour not in _FLAVOURS:
            raise ValueError(f"unknown flavour {flavour!r}; expected one of {_FLAVOURS}")
        self.log_path = Path(log_path)
        self.flavour: Flavour = flavour
        super().__init__(port)
        self.delay = delay
        self._lock = threading.Lock()  # guards _by_key and log appends
        self._by_key: dict[str, JSONDict] = {}
        self._flight_lock = threading.Lock()
        self._in_flight = 0
        self._max_in_flight = 0

    # --- lifecycle ---------------------------------------------------------

    def _before_start(self) -> None:
        """Rebuild the key -> refund map from the log (a restart keeps deduplicating)."""
        with self._lock:
            self._by_key = {}
            for refund_obj in refunds_in_log(self.log_path):
                key = refund_obj.get("idempotency_key")
                if isinstance(key, str):
                    self._by_key.setdefault(key, refund_obj)
            if self.log_path.exists() and self.log_path.stat().st_size > 0:
                with open(self.log_path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    torn = f.read(1) != b"\n"
                if torn:  # keep the next line on a line of its own
                    with open(self.log_path, "a", encoding="utf-8") as f:
                        f.write("\n")

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (only while started)."""
        return f"http://127.0.0.1:{self.bound_port}"

    # --- inspection ----------------------------------------------------------

    def requests(self) -> list[JSONDict]:
        """Every logged request (including GETs), read from the log file."""
        return read_log(self.log_path)

    def refunds(self) -> list[JSONDict]:
        """The distinct refunds actually created, read from the log file."""
        return refunds_in_log(self.log_path)

    @property
    def max_in_flight(self) -> int:
        """High-water mark of concurrently handled ``POST /refunds`` requests."""
        return self._max_in_flight

    # --- request handling (called from handler threads) -----------------------

    def _enter(self) -> None:
        with self._flight_lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _exit(self) -> None:
        with self._flight_lock:
            self._in_flight -= 1

    def _handle(
        self, method: str, raw_path: str, key: str | None, raw: bytes
    ) -> tuple[int, object, dict[str, str]]:
        """Decide the response, update state and log the request, atomically."""
        try:
            body: object = json.loads(raw) if raw else None
            bad_json = False
        except ValueError:
            body, bad_json = None, True
        parts = urllib.parse.urlsplit(raw_path)
        route = (method, parts.path)
        status, payload, headers = 404, cast(object, {"error": "no such endpoint"}), {}
        created: JSONDict | None = None
        result: JSONDict | None = None
        with self._lock:
            if route == ("GET", "/health"):
                status, payload = 200, {"ok": True}
            elif route == ("GET", "/refunds"):
                wanted = urllib.parse.parse_qs(parts.query).get("idempotency_key", [""])[0]
                result = self._by_key.get(wanted) if self.flavour == "lookup" else None
                if self.flavour != "lookup":
                    status, payload = 501, {"error": "lookup not supported"}
                elif not wanted:
                    status, payload = 400, {"error": "idempotency_key query parameter required"}
                else:
                    status, payload = (200, result) if result else (404, {"error": "not found"})
            elif route == ("POST", "/refunds"):
                amount = body.get("amount") if isinstance(body, dict) else None
                if (
                    bad_json
                    or not isinstance(body, dict)
                    or not isinstance(body.get("order_id"), str)
                    or isinstance(amount, bool)
                    or not isinstance(amount, int | float | str)
                ):
                    status, payload = 400, {"error": "expected {order_id: str, amount: number}"}
                elif key is not None and self.flavour != "plain" and key in self._by_key:
                    status, payload = 200, (result := self._by_key[key])
                    headers["Idempotent-Replayed"] = "true"
                else:
                    created = result = {
                        "refund_id": f"re_{secrets.token_hex(6)}",
                        "order_id": body["order_id"],
                        "amount": amount,
                        "idempotency_key": key,
                        "created_at": time.time(),
                    }
                    if key is not None:
                        self._by_key.setdefault(key, created)
                    status, payload = 200, created
            self._append(
                {
                    "ts": time.time(),
                    "method": method,
                    "path": raw_path,
                    "idempotency_key": key,
                    "body": body,
                    "status": status,
                    "refund_id": result["refund_id"] if result is not None else None,
                    "created": created is not None,
                    "refund": created,
                }
            )
        return status, payload, headers

    def _append(self, line: JSONDict) -> None:
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())


# --- client helpers -------------------------------------------------------------


def _call(req: urllib.request.Request) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT) as resp:
            return int(resp.status), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        try:
            data = err.read()
        finally:
            err.close()
        try:
            return err.code, json.loads(data or b"null")
        except ValueError:
            return err.code, data.decode(errors="replace")


def refund(
    base_url: str, order_id: str, amount: float | str, *, idempotency_key: str | None = None
) -> JSONDict:
    """``POST /refunds`` and return the refund; raise :class:`PaymentsError` if not 200."""
    headers = {"Content-Type": "application/json"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    data = json.dumps({"order_id": order_id, "amount": amount}).encode()
    req = urllib.request.Request(
        f"{base_url.rstrip('/')}/refunds", data=data, headers=headers, method="POST"
    )
    status, body = _call(req)
    if status != 200 or not isinstance(body, dict):
        raise PaymentsError(status, body)
    return cast(JSONDict, body)


def find_refund(base_url: str, idempotency_key: str) -> JSONDict | None:
    """Look up the refund created under a key; None if there is none.

    Raises :class:`PaymentsError` when the service does not support lookups
    (501) or answers anything else unexpected.
    """
    query = urllib.parse.urlencode({"idempotency_key": idempotency_key})
    req = urllib.request.Request(f"{base_url.rstrip('/')}/refunds?{query}", method="GET")
    status, body = _call(req)
    if status == 404:
        return None
    if status != 200 or not isinstance(body, dict):
        raise PaymentsError(status, body)
    return cast(JSONDict, body)


# --- command line -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; optionally write the chosen port to a file."""
    parser = argparse.ArgumentParser(prog="python -m durably.testing.payments")
    parser.add_argument("--log", required=True, help="JSONL log file (appended to)")
    parser.add_argument("--flavour", choices=_FLAVOURS, default="idempotent")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the bound port here (atomically)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before replying")
    args = parser.parse_args(argv)

    server = FakePaymentsServer(
        args.log, flavour=cast(Flavour, args.flavour), port=args.port, delay=args.delay
    ).start()
    return loopback.serve_until_signal(server, args.port_file)


if __name__ == "__main__":
    raise SystemExit(main())
