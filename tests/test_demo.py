"""The demos as tests: real processes, a real SIGKILL inside the refund, counted effects.

``durably demo`` (a model-driven agent, parked for approval, approved from
another process, killed inside the refund, recovered) is judged from its files:
the payments log, the fake model server's request log, the outbox and the
database, not from what it prints.
"""

from __future__ import annotations

import collections
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import durably
from durably.testing import payments
from durably.testing.models import read_log
from tests import children


def _env() -> dict[str, str]:
    """Our environment without a crash plan or a real model endpoint (the demo picks the fake)."""
    return children.child_env(drop=("DURABLY_", "OPENAI_"))


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), **env},
        check=False,
    )


def _commands(out: str) -> list[list[str]]:
    """The shell commands the demo printed (``$ durably ...`` and its ``\\`` continuations)."""
    commands: list[list[str]] = []
    lines = iter(out.splitlines())
    for line in lines:
        if line.strip().startswith("$ "):
            text = line.strip()[2:]
            while text.endswith("\\"):
                text = text[:-1] + next(lines).strip()
            commands.append(shlex.split(text))
    return commands


def _assert_one_refund(log: Path) -> list[dict[str, object]]:
    posts = [r for r in payments.read_log(log) if r["method"] == "POST"]
    assert len(posts) == 2
    assert len({r["idempotency_key"] for r in posts}) == 1
    assert [r["created"] for r in posts] == [True, False]
    assert len({r["refund_id"] for r in posts}) == 1
    [refund] = payments.refunds_in_log(log)
    assert (refund["order_id"], refund["amount"]) == ("ORD-9912", "120.00")
    return posts


def test_scripted_demo_kills_inside_the_refund_and_refunds_once(tmp_path: Path) -> None:
    proc = _run("-m", "durably.cli", "demo", "--scripted", "--workdir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "exited with -9 (SIGKILL)" in out
    assert "gap: the process was dead here; everything above was replayed" in out

    _assert_one_refund(tmp_path / "payments.log")
    # get_ticket and classify ran once (in the first process), the email once.
    assert out.count("get_ticket(TCK-4417)") == 1
    assert out.count("classify_intent -> refund") == 1
    assert out.count("send_email(") == 1
    emails = (tmp_path / "outbox.log").read_text().splitlines()
    assert len(emails) == 1 and json.loads(emails[0])["to"] == "ada@example.com"


def test_agent_demo_parks_is_approved_killed_and_recovered_without_paying_twice(
    tmp_path: Path,
) -> None:
    pytest.importorskip("openai")
    proc = _run("-m", "durably.cli", "demo", "--workdir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exited with -9 (SIGKILL)" in proc.stdout
    assert "gap: the process was dead here; everything above was replayed" in proc.stdout

    # killed where it was meant to be: after the refund call returned, before its receipt
    marker = (tmp_path / "crashed").read_text().strip()
    assert marker == "after_call:tool:issue_refund:call_refund"

    # the payments service: two requests, one key, one refund (the second was replayed)
    posts = _assert_one_refund(tmp_path / "payments.log")
    assert all(r["path"] == "/refunds" for r in posts)

    # the model: every turn asked exactly once, across the four processes
    requests = read_log(tmp_path / "model.log")
    counts = collections.Counter(r["turn"] for r in requests)
    assert sorted(counts) == [0, 1, 2, 3, 4]
    assert set(counts.values()) == {1}, counts
    assert all(r["status"] == 200 for r in requests)
    assert len({r["idempotency_key"] for r in requests}) == 5
    asked = [[c["function"]["name"] for c in r["reply"].get("tool_calls") or []] for r in requests]
    assert asked == [["get_ticket"], ["lookup_order"], ["issue_refund"], ["send_email"], []]
    # turns 0-2 came before the refund, turns 3-4 after the recovery's replayed request
    assert max(r["ts"] for r in requests[:3]) < float(str(posts[0]["ts"]))
    assert min(r["ts"] for r in requests[3:]) > float(str(posts[1]["ts"]))

    # one email
    emails = [json.loads(line) for line in (tmp_path / "outbox.log").read_text().splitlines()]
    assert len(emails) == 1 and emails[0]["to"] == "ada@example.com"
    assert "120.00" in emails[0]["body"]

    # the workflow completed; the approval was decided by "demo", once, and journaled
    with durably.Client(f"sqlite:///{tmp_path / 'demo.db'}") as client:
        info = client.get_workflow("refund-TCK-4417")
        history = client.history("refund-TCK-4417")
        approval = client.get_event("refund-TCK-4417", "approval:call_refund")
        assert client.list_approvals() == []
    assert info.status == "completed"
    assert (approval["status"], approval["decided_by"], approval["tool"]) == (
        "approved",
        "demo",
        "issue_refund",
    )
    assert approval["arguments"] == {"order_id": "ORD-9912", "amount": "120.00"}
    [signal] = [e for e in history if e.kind == "signal"]
    decision = json.loads(signal.payload or "{}")
    assert (decision["decision"], decision["by"]) == ("approve", "demo") and decision["at"]
    tool_steps = [e.name for e in history if e.name.startswith("tool:")]
    assert tool_steps == [
        "tool:get_ticket:call_ticket",
        "tool:lookup_order:call_order",
        "tool:issue_refund:call_refund",
        "tool:send_email:call_email",
    ]

    # the recovery replayed three model calls and paid for two
    result = json.loads(info.output or "{}")
    assert (result["replayed"]["calls"], result["billed"]["calls"]) == (3, 2)
    assert result["usage"].startswith("replayed 3 model calls")
    served = [r["usage"] for r in requests]
    assert result["replayed"]["prompt_tokens"] == sum(u["prompt_tokens"] for u in served[:3])
    assert result["usage"] in " ".join(proc.stdout.split())  # wrapped at 80 columns

    # `durably show` says what the crash would have cost: the turns before the kill
    shown = _run(
        "-m",
        "durably.cli",
        "--database",
        f"sqlite:///{tmp_path / 'demo.db'}",
        "show",
        "refund-TCK-4417",
    )
    assert shown.returncode == 0, shown.stderr
    replayed_tokens = sum(u["prompt_tokens"] + u["completion_tokens"] for u in served[:3])
    assert f"recovery replayed 3 model calls ({replayed_tokens:,} tokens" in shown.stdout
    assert "model usage: 5 model calls" in shown.stdout


@pytest.mark.parametrize("scripted", [True, False], ids=["scripted", "agent"])
def test_demo_fits_80_columns_prints_whole_commands_and_keeps_only_its_database(
    tmp_path: Path, scripted: bool
) -> None:
    """At 80 columns nothing is cut, the approve command holds the whole hash, the
    ``durably show`` command printed last runs as printed, and the only thing left
    in the temporary directory is the folder of the database it names."""
    if not scripted:
        pytest.importorskip("openai")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    argv = ["-m", "durably.cli", "demo", *(["--scripted"] if scripted else [])]
    proc = _run(*argv, COLUMNS="80", TMPDIR=str(tmp))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout

    # what is left: one folder, holding the database and nothing else
    [kept] = list(tmp.iterdir())
    assert kept.name.startswith("durably-demo-")
    assert {p.name for p in kept.iterdir()} <= {"demo.db", "demo.db-wal", "demo.db-shm"}
    database = kept / "demo.db"
    assert database.is_file()
    assert f"The database is kept: {database}" in out

    # nothing cut, and every line fits 80 columns but those that hold the path
    assert "…" not in out
    long = [line for line in out.splitlines() if len(line) > 80 and str(database) not in line]
    assert long == [], long

    # one way to write the amount: 120.00, never 120.0
    assert "120.00" in out and not re.search(r"120\.0(?!0)", out), out

    commands = _commands(out)
    if not scripted:
        with durably.Client(f"sqlite:///{database}") as client:
            approval = client.get_event("refund-TCK-4417", "approval:call_refund")
        [approve] = [c for c in commands if "approve" in c]
        assert approve[approve.index("--expect") + 1] == approval["args_sha256"]
        assert len(approval["args_sha256"]) == 64
        assert approve[:3] == ["durably", "--database", f"sqlite:///{database}"]

    # the next step: the last line of the demo is a command that runs as printed
    show = commands[-1]
    assert show == ["durably", "--database", f"sqlite:///{database}", "show", "refund-TCK-4417"]
    assert out.rstrip().endswith("show refund-TCK-4417")
    shown = subprocess.run(
        [sys.executable, "-m", "durably.cli", *show[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(), "TMPDIR": str(tmp)},
        cwd=tmp_path,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "refund-TCK-4417" in shown.stdout and "completed" in shown.stdout
    assert "gap: the process was dead here; everything above was replayed" in shown.stdout
    assert [p.name for p in tmp.iterdir()] == [kept.name]
