"""A recorded step error comes back, after a restart, as the type the live run raised.

A provider error (``openai.BadRequestError``), an httpx error or a user's own
exception whose constructor takes other arguments than its ``args`` must not
turn into ``durably.StepError`` on replay: the workflow's ``except`` clause
would take another path after recovery than it did live. Each workflow here
catches the error, parks on a signal, and is finished by a second Engine (a
restart), so the value returned is what the *replayed* error carried.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2 as httpx  # the HTTP client openai uses here (httpx's successor)
import openai

import durably
from durably import agents
from durably.testing.models import FakeModelServer, failure

URL: list[str] = []


class QuotaExceeded(Exception):
    """A user exception whose constructor takes keywords, not its message."""

    def __init__(self, *, account: str, limit: int) -> None:
        super().__init__(f"account {account} is over its quota of {limit}")
        self.account = account
        self.limit = limit


@durably.step
async def over_quota() -> None:
    raise QuotaExceeded(account="acme", limit=5)


@durably.step
async def fetch_status() -> int:
    async with httpx.AsyncClient() as client:
        response = await client.get(URL[0] + "/nope")
        response.raise_for_status()
        return response.status_code


async def _park() -> None:
    await durably.wait_for_signal("go")


@durably.workflow(name="errors-openai")
async def openai_flow(base_url: str) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0)
    llm = agents.llm(client)
    try:
        await llm.chat.completions.create(model="gpt-4.1-mini", messages=[])
    except openai.BadRequestError as exc:
        seen = {
            "type": type(exc).__name__,
            "status": exc.status_code,
            "body": exc.body,
            "code": exc.code,
            "message": exc.message,
            "response_status": exc.response.status_code,
        }
    finally:
        await client.close()
    await _park()
    return seen


@durably.workflow(name="errors-user")
async def user_flow() -> dict[str, Any]:
    try:
        await over_quota()
    except QuotaExceeded as exc:
        seen = {"account": exc.account, "limit": exc.limit, "message": str(exc)}
    await _park()
    return seen


@durably.workflow(name="errors-httpx")
async def httpx_flow() -> dict[str, Any]:
    try:
        await fetch_status()
    except httpx.HTTPStatusError as exc:
        seen = {
            "status": exc.response.status_code,
            "url": str(exc.request.url),
            "method": exc.request.method,
            "message": str(exc),
        }
    await _park()
    return seen


async def _live_then_replayed(url: str, wf: Any, *args: Any) -> Any:
    """Run ``wf`` until it parks, stop that engine, finish it in a new one (a replay)."""
    async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.1) as engine:
        handle = await engine.start(wf, *args, workflow_id="wf")
        deadline = asyncio.get_running_loop().time() + 10
        while (status := await handle.status()) != "waiting":
            assert status in ("pending", "running"), f"the live run ended {status}"
            assert asyncio.get_running_loop().time() < deadline, "never parked"
            await asyncio.sleep(0.02)
    async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.1) as engine:
        await engine.send_signal("wf", "go")
        return await engine.handle("wf").result(timeout=10)


async def test_a_provider_error_replays_as_its_own_type(store_url: str) -> None:
    with FakeModelServer([failure(400, message="messages must not be empty")]) as server:
        result = await _live_then_replayed(store_url, openai_flow, server.url)
        assert len(server.requests) == 1  # the replay asked nothing
    assert result["type"] == "BadRequestError"
    assert result["status"] == 400 and result["response_status"] == 400
    assert "messages must not be empty" in result["message"]
    assert result["body"]["message"] == "messages must not be empty"
    assert result["code"] == result["body"].get("code")


async def test_a_user_exception_with_keyword_arguments_replays_as_itself(store_url: str) -> None:
    result = await _live_then_replayed(store_url, user_flow)
    assert result == {
        "account": "acme",
        "limit": 5,
        "message": "account acme is over its quota of 5",
    }


async def test_an_httpx_status_error_replays_with_its_request_and_response(
    store_url: str,
) -> None:
    with FakeModelServer([]) as server:
        URL[:] = [server.url]
        result = await _live_then_replayed(store_url, httpx_flow)
    assert result["status"] == 404
    assert result["method"] == "GET" and result["url"].endswith("/nope")
    assert "404" in result["message"]
