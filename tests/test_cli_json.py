"""``--json`` on the commands that print tables: stable JSON that scripts can read."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

import durably
from durably import cli
from tests.serverkit import harness


def run(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli.main, ["--database", url, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


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


def test_show_json_of_an_unknown_workflow_fails_with_the_message(sqlite_url: str) -> None:
    assert CliRunner().invoke(cli.main, ["--database", sqlite_url, "migrate"]).exit_code == 0
    result = CliRunner().invoke(cli.main, ["--database", sqlite_url, "show", "nope", "--json"])
    assert result.exit_code == 1 and "no workflow with id 'nope'" in result.output
