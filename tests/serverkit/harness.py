"""Running what the server tests need: an engine on a thread, a parked review, a real server."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import durably
from tests import children
from tests.serverkit import flows

TOKEN = "alice:test-token-0123456789abcdef"
SECRET = "test-token-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]


def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def engine_thread(url: str) -> Iterator[None]:
    """An Engine running workflows on its own thread and event loop until the block ends."""
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        holder["stop"] = stop
        holder["loop"] = asyncio.get_running_loop()
        async with durably.Engine(url, poll_interval=0.05):
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # shown by the test that waits for ready
            holder["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30), "the engine did not open"
    if "error" in holder:
        raise holder["error"]
    try:
        yield
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)


def park_for_review(url: str, workflow_id: str, order_id: str = "ORD-1") -> None:
    """Start srv-transfer and stop its engine hard inside the at-most-once step.

    The intent is journaled, the receipt never is: the next engine to run the
    workflow cannot know whether the transfer happened and parks it for review.
    """

    async def main() -> None:
        flows.HANG["hang"] = asyncio.Event()
        flows.RAN.clear()
        engine = durably.Engine(url, hold_seconds=0.05, poll_interval=0.05)
        await engine.open()
        try:
            await engine.start(flows.transfer_flow, order_id, workflow_id=workflow_id)
            while order_id not in flows.RAN:
                await asyncio.sleep(0.01)
        finally:
            await engine.close(drain_timeout=0.05)
            del flows.HANG["hang"]

    asyncio.run(main())


def login(http: Any, base: str = "", token: str = SECRET, **form: str) -> Any:
    """Log in as a browser does: load the login page (which sets its pre-session cookie
    and puts the matching token in the form), then post the form with ``token``.

    ``http`` is an ``httpx.Client`` (or Starlette's TestClient) that keeps cookies;
    returns the answer to the post, not followed (303 when logged in).
    """
    page = http.get(base + "/login")
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    fields = {"token": token, **form}
    if found is not None:
        fields["csrf_token"] = found[1]
    return http.post(base + "/login", data=fields, follow_redirects=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """A child process (stdout and stderr to one pipe), killed when the block ends."""
    full = children.child_env(env, drop=(), paths=[ROOT, ROOT / "src"])
    proc = subprocess.Popen(
        args, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def server(url: str, env: dict[str, str] | None = None, args: Sequence[str] = ()) -> Iterator[str]:
    """A real ``durably serve`` on a free loopback port (``args``: more options of
    ``serve``); its base URL once it answers."""
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "durably.cli", "--database", url, "serve", "--port", str(port)]
    with process([*command, *args], {"DURABLY_API_TOKEN": TOKEN, **(env or {})}) as proc:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"durably serve exited: {proc.stdout.read() if proc.stdout else ''}"
                )
            try:
                return httpx.get(base + "/openapi.json", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        until(up, "durably serve to answer", 30)
        yield base


@contextlib.contextmanager
def worker(url: str, lease: float = 30.0) -> Iterator[subprocess.Popen[str]]:
    """A real ``durably worker`` running tests.serverkit.flows."""
    args = [
        sys.executable,
        "-m",
        "durably.cli",
        "--database",
        url,
        "worker",
        "tests.serverkit.flows",
        "--poll",
        "0.1",
        "--lease",
        str(lease),
    ]
    with process(args) as proc:
        yield proc
