"""The demo scenario as a test: a real SIGKILL inside issue_refund, counted effects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from durably.testing import payments


def test_demo_kills_inside_the_refund_and_refunds_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "durably.cli", "demo", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "exited with -9 (SIGKILL)" in out
    assert "gap: the process was dead here; everything above was replayed" in out

    posts = [r for r in payments.read_log(tmp_path / "payments.log") if r["method"] == "POST"]
    assert len(posts) == 2
    assert len({r["idempotency_key"] for r in posts}) == 1
    assert len(payments.refunds_in_log(tmp_path / "payments.log")) == 1
    assert [r["created"] for r in posts] == [True, False]

    # get_ticket and classify ran once (in the first process), the email once.
    assert out.count("get_ticket(TCK-4417)") == 1
    assert out.count("classify_intent -> refund") == 1
    assert out.count("send_email(") == 1
    emails = (tmp_path / "outbox.log").read_text().splitlines()
    assert len(emails) == 1 and json.loads(emails[0])["to"] == "ada@example.com"
