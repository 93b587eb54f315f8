"""``--json`` on the commands that print tables: stable JSON that scripts can read."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import durably
from durably import cli
from tests import children
from tests.serverkit import harness


def run(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli.main, ["--database", url, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def documented(command: str) -> set[str]:
    """The keys docs/dashboard.md lists for ``durably <command> --json``."""
    text = (harness.ROOT / "docs" / "dashboard.md").read_text(encoding="utf-8")
    section = text.split(f"### `durably {command} --json`", 1)[1].split("\n### ", 1)[0]
    keys = section.split("keys:", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(\w+)`", keys))


def test_list_show_workers_and_reviews_print_json(store_url: str) -> None:
    client = durably.Client(store_url)
    client.start("srv-wait", workflow_id="w1")
    client.start("srv-other", {"x": "<&>"}, workflow_id="w2")
    harness.park_for_review(store_url, "t1")
    assert run(store_url, "list", "--json", "--name", "nothing") == ""
    with harness.engine_thread(store_url):
        harness.until(lambda: client.get_workflow("w1").status == "waiting", "w1 to wait")
        client.send_signal("w1", "go", {"ok": True})
        harness.until(lambda: client.get_workflow("w1").status == "completed", "w1 to complete")
        harness.until(lambda: client.reviews(), "t1 to park for review")
        [worker] = lines(run(store_url, "workers", "--json"))
        assert worker["pid"] > 0 and "heartbeat_age" in worker
    listed = lines(run(store_url, "list", "--json"))
    assert {w["workflow_id"] for w in listed} == {"w1", "w2", "t1"}
    by_id = {w["workflow_id"]: w for w in listed}
    assert by_id["w2"]["input"] == {"args": [{"x": "<&>"}], "kwargs": {}}
    assert by_id["w1"]["status"] == "completed" and by_id["w1"]["output"] == {"ok": True}
    shown = json.loads(run(store_url, "show", "w1", "--json"))
    assert shown["workflow"]["output"] == {"ok": True}
    assert [r["label"] for r in shown["timeline"]] == ["signal() go"]
    assert shown["entries"][0]["payload"] == {"ok": True}
    assert shown["claims"][0]["reason"] == "start"
    [review] = lines(run(store_url, "review", "list", "--json"))
    assert (review["workflow_id"], review["seq"], review["step"]) == ("t1", 1, "transfer")
    assert review["intent"]["args"] == ["ORD-1"]
    # the documented keys are exactly the printed ones
    assert set(by_id["w1"]) == documented("list")
    assert set(shown) == documented("show ID")
    assert set(worker) == documented("workers")
    assert set(review) == documented("review list")


def test_show_json_of_an_unknown_workflow_fails_with_the_message(sqlite_url: str) -> None:
    assert CliRunner().invoke(cli.main, ["--database", sqlite_url, "migrate"]).exit_code == 0
    result = CliRunner().invoke(cli.main, ["--database", sqlite_url, "show", "nope", "--json"])
    assert result.exit_code == 1 and "no workflow with id 'nope'" in result.output


def test_approvals_json_prints_the_api_shape_keys_sorted(store_url: str) -> None:
    from starlette.testclient import TestClient

    from durably.server import app, auth

    client = durably.Client(store_url)
    client.start("srv-refund", "A1", 12_000, workflow_id="r1")
    client.start("srv-wait", workflow_id="w1")
    with harness.engine_thread(store_url):
        harness.until(lambda: client.get_workflow("r1").status == "waiting", "r1 to wait")
    printed = run(store_url, "approvals", "--json")
    [line] = printed.splitlines()
    [approval] = lines(printed)
    assert list(approval) == sorted(approval)  # keys sorted: stable text for scripts
    assert line == json.dumps(approval, sort_keys=True)
    assert approval["workflow_id"] == "r1" and approval["tool"] == "refund"
    assert approval["arguments"] == {"order_id": "A1", "cents": 12_000}
    assert approval["call"] == "refund(order_id='A1', cents=12000)"
    assert set(approval) == documented("approvals")
    tokens = auth.parse_tokens(harness.TOKEN, "test")
    with TestClient(app.create_app(store_url, tokens)) as http:
        bearer = {"Authorization": f"Bearer {harness.SECRET}"}
        served = http.get("/api/approvals", headers=bearer).json()["approvals"]
    assert served == [approval]  # the same shape as GET /api/approvals
    assert run(store_url, "approvals", "w1", "--json") == ""  # nothing pending: no line
    assert lines(run(store_url, "approvals", "r1", "--json")) == [approval]


def test_errors_go_to_stderr_and_leave_stdout_to_the_json(tmp_path: Path) -> None:
    """In a real pipe: a script reading stdout gets JSON or nothing, never the error line
    (before: `error: ...` of list, show, workers, review list and delete was on stdout)."""
    good = f"sqlite:///{tmp_path / 'good.db'}"
    assert CliRunner().invoke(cli.main, ["--database", good, "migrate"]).exit_code == 0
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    for url, args, said in [
        (missing, ["list", "--json"], "no SQLite database"),
        (missing, ["workers", "--json"], "no SQLite database"),
        (missing, ["review", "list", "--json"], "no SQLite database"),
        (missing, ["approvals", "--json"], "no SQLite database"),
        (good, ["show", "nope", "--json"], "no workflow with id 'nope'"),
        (good, ["list", "--json", "--after", "nope"], "no workflow with id 'nope'"),
        (good, ["delete", "nope"], "no workflow with id 'nope'"),
        (good, ["cancel", "nope"], "no workflow with id 'nope'"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "durably.cli", "--database", url, *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=children.child_env(),
            timeout=60,
        )
        assert done.returncode == 1, (args, done)
        assert done.stdout == "", (args, done.stdout)
        assert done.stderr.startswith("error: ") and said in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "missing.db").exists()
