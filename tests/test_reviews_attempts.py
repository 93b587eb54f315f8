"""A decision on a review applies to the review it was made for: a step decided ``retry``
whose new attempt again ends unknown opens a second review at the same seq, and a
duplicate of the first decision (a resolve run twice, a form posted twice) must not
decide it. Real SQLite / PostgreSQL, real engines stopped hard inside the step."""

from __future__ import annotations

import asyncio
import html
import re
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import durably
from durably import cli
from durably.server import app, auth
from tests.serverkit import harness

RAN: list[str] = []
HANG: dict[str, asyncio.Event] = {}


@durably.step(at_most_once=True)
async def wire(order: str) -> dict[str, str]:
    RAN.append(durably.idempotency_key())
    if "hang" in HANG:
        await HANG["hang"].wait()
    return {"wire_id": f"w-{order}"}


@durably.workflow
async def wire_flow(order: str) -> Any:
    return await wire(order)


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    HANG.clear()


async def _until(check: Any, what: str, timeout: float = 10.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await check()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def _cut_inside_the_step(url: str, wid: str, start: bool) -> None:
    """Run (or recover) the workflow and stop its engine hard while the step hangs."""
    HANG["hang"] = asyncio.Event()
    calls = len(RAN)
    engine = durably.Engine(url, hold_seconds=0.05, poll_interval=0.05)
    await engine.open()
    try:
        if start:
            await engine.start(wire_flow, "ORD-1", workflow_id=wid)

        async def called() -> bool:
            return len(RAN) > calls

        await _until(called, "the step to be called")
    finally:
        await engine.close(drain_timeout=0.05)
        del HANG["hang"]


async def _park(url: str, wid: str) -> durably.Review:
    """Recover the workflow until it parks for review; the review it opened."""
    async with durably.Engine(url, poll_interval=0.05) as engine:

        async def parked() -> bool:
            return await engine.handle(wid).status() == "needs_review"

        await _until(parked, "the workflow to park for review")
        (review,) = await engine.reviews()
    return review


# --- the ways a person decides: what each shows, then the decision sent from it --------


def _app(url: str) -> TestClient:
    return TestClient(app.create_app(url, auth.parse_tokens(harness.TOKEN, "test")))


def _show_client(url: str, wid: str) -> Any:
    with durably.Client(url) as client:
        (review,) = client.reviews(wid)
    return review


def _send_client(url: str, wid: str, shown: Any) -> None:
    with durably.Client(url) as client:
        client.resolve(wid, shown.seq, retry=True, attempt=shown.attempt, by="ann")


def _show_api(url: str, wid: str) -> Any:
    with _app(url) as c:
        c.headers.update({"Authorization": f"Bearer {harness.SECRET}"})
        (item,) = c.get("/api/reviews").json()["reviews"]
    path = f"/api/workflows/{wid}/reviews/{item['seq']}/resolve"
    return path, {"retry": True, "attempt": item["attempt"]}


def _send_api(url: str, wid: str, shown: Any) -> None:
    path, body = shown
    with _app(url) as c:
        c.headers.update({"Authorization": f"Bearer {harness.SECRET}"})
        r = c.post(path, json=body)
    if r.status_code != 200:
        raise durably.AlreadyResolved(f"{r.status_code}: {r.text}")


def _login(c: TestClient) -> None:
    assert harness.login(c, next="/").status_code == 303


def _show_dashboard(url: str, wid: str) -> Any:
    """The review page's form: its action and fields, ``retry`` chosen."""
    with _app(url) as c:
        _login(c)
        page = c.get("/reviews").text
    form = re.search(r'<form class="resolve" method="post" action="([^"]+)".*?</form>', page, re.S)
    assert form is not None, page
    fields = {
        html.unescape(name): html.unescape(value)
        for name, value in re.findall(
            r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form.group(0)
        )
    }
    fields.pop("csrf_token")  # the session's: the post takes the one of its own session
    return html.unescape(form.group(1)), {**fields, "decision": "retry"}


def _send_dashboard(url: str, wid: str, shown: Any) -> None:
    action, fields = shown
    with _app(url) as c:
        _login(c)
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', c.get("/reviews").text)
        assert csrf is not None
        r = c.post(action, data={**fields, "csrf_token": csrf.group(1)}, follow_redirects=False)
    if r.status_code != 303:
        raise durably.AlreadyResolved(f"{r.status_code}: {r.text}")


def _cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli.main, ["-d", url, *args], env={"COLUMNS": "300"})


def _show_cli(url: str, wid: str) -> Any:
    """The command ``durably review list`` prints to decide, with ``--retry``."""
    listed = _cli(url, "review", "list")
    assert listed.exit_code == 0, listed.output
    decide = re.search(
        r"decide\s+durably (review resolve .*) \\\n\s+((?:--attempt \d+)?)", listed.output
    )
    assert decide is not None, listed.output
    return [*decide.group(1).split(), *decide.group(2).split(), "--retry", "--by", "ann"]


def _send_cli(url: str, wid: str, shown: Any) -> None:
    done = _cli(url, *shown)
    if done.exit_code != 0:
        raise durably.AlreadyResolved(done.output)


WAYS = {
    "client": (_show_client, _send_client),
    "api": (_show_api, _send_api),
    "dashboard": (_show_dashboard, _send_dashboard),
    "cli": (_show_cli, _send_cli),
}


async def _second_review(url: str, wid: str, way: str) -> Any:
    """Park a review, decide it ``retry`` as ``way`` does, cut the retried attempt
    again: a second review at the same seq, which that decision was not about.
    Returns what ``way`` showed for the first review (its decision can be sent again)."""
    show, send = WAYS[way]
    await _cut_inside_the_step(url, wid, start=True)
    first = await _park(url, wid)
    assert (first.seq, first.attempt) == (1, 1)
    shown = await asyncio.to_thread(show, url, wid)
    await asyncio.to_thread(send, url, wid, shown)
    await _cut_inside_the_step(url, wid, start=False)  # the retry: attempt 2, cut again
    second = await _park(url, wid)
    assert (second.seq, second.attempt, second.decision) == (1, 2, None)
    return shown


@pytest.mark.parametrize("way", list(WAYS))
async def test_a_duplicate_decision_does_not_decide_the_next_review_at_that_seq(
    sqlite_url: str, way: str
) -> None:
    shown = await _second_review(sqlite_url, "wf", way)
    with pytest.raises(durably.AlreadyResolved) as refused:  # the same decision again
        await asyncio.to_thread(WAYS[way][1], sqlite_url, "wf", shown)
    said = str(refused.value)
    assert "seq 1 attempt 1: it was decided already (retry by" in said, said
    assert "the review open there now is attempt 2" in said, said
    with durably.Client(sqlite_url) as client:
        (still,) = client.reviews("wf")
        assert (still.seq, still.attempt, still.decision) == (1, 2, None)
        assert client.get_workflow("wf").status == "needs_review"
    assert RAN == ["wf:1", "wf:1"]  # the retried attempt ran once, nothing ran a third time


async def test_a_stale_decision_is_refused_on_each_backend_and_the_open_one_decided(
    store_url: str,
) -> None:
    first = await _second_review(store_url, "wf", "client")
    with durably.Client(store_url) as client:
        with pytest.raises(durably.AlreadyResolved, match=r"attempt 1\b.*attempt 2"):
            client.resolve("wf", 1, retry=True, attempt=first.attempt, by="ann")
        with pytest.raises(durably.NothingToResolve, match="attempt 7"):
            client.resolve("wf", 1, retry=True, attempt=7, by="ann")
        assert client.get_workflow("wf").status == "needs_review"
        decided = client.resolve("wf", 1, result={"wire_id": "w-seen"}, attempt=2, by="bo")
        assert (decided.attempt, decided.decision) == (2, "result")
    async with durably.Engine(store_url, poll_interval=0.05) as engine:
        assert await engine.handle("wf").result(timeout=10) == {"wire_id": "w-seen"}
    assert RAN == ["wf:1", "wf:1"]
