"""The fake payments service counts real side effects correctly."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from durably.testing import FakePaymentsServer, refund
from durably.testing.payments import (
    PaymentsError,
    find_refund,
    read_log,
    refunds_in_log,
)
from tests import children

SRC = Path(__file__).resolve().parents[1] / "src"


def _posts(lines: list[dict[str, object]]) -> list[dict[str, object]]:
    return [ln for ln in lines if ln["method"] == "POST" and ln["path"] == "/refunds"]


@pytest.mark.parametrize("flavour", ["idempotent", "lookup"])
def test_repeated_key_is_deduplicated(tmp_path: Path, flavour) -> None:
    log = tmp_path / "payments.jsonl"
    with FakePaymentsServer(log, flavour=flavour) as srv:
        first = refund(srv.url, "o-1", 12.5, idempotency_key="k1")
        second = refund(srv.url, "o-1", 12.5, idempotency_key="k1")
        assert first == second
        assert str(first["refund_id"]).startswith("re_") and len(str(first["refund_id"])) == 15
        posts = _posts(srv.requests())
        assert len(posts) == 2
        assert {p["idempotency_key"] for p in posts} == {"k1"}
        assert [p["created"] for p in posts] == [True, False]
        assert [p["refund_id"] for p in posts] == [first["refund_id"]] * 2
        assert srv.refunds() == [first]


def test_plain_creates_a_refund_per_request(tmp_path: Path) -> None:
    log = tmp_path / "payments.jsonl"
    with FakePaymentsServer(log, flavour="plain") as srv:
        first = refund(srv.url, "o-1", "9.99", idempotency_key="k1")
        second = refund(srv.url, "o-1", "9.99", idempotency_key="k1")
        assert first["refund_id"] != second["refund_id"]
        assert len(_posts(srv.requests())) == 2
        assert [r["refund_id"] for r in srv.refunds()] == [
            first["refund_id"],
            second["refund_id"],
        ]


def test_no_key_always_creates(tmp_path: Path) -> None:
    with FakePaymentsServer(tmp_path / "p.jsonl") as srv:
        refund(srv.url, "o-1", 1)
        refund(srv.url, "o-1", 1)
        assert len(srv.refunds()) == 2


def test_lookup_finds_by_key(tmp_path: Path) -> None:
    with FakePaymentsServer(tmp_path / "p.jsonl", flavour="lookup") as srv:
        made = refund(srv.url, "o-1", 5, idempotency_key="k1")
        assert find_refund(srv.url, "k1") == made
        assert find_refund(srv.url, "nope") is None
        assert len(srv.refunds()) == 1
        statuses = [ln["status"] for ln in srv.requests() if ln["method"] == "GET"]
        assert statuses == [200, 404]


@pytest.mark.parametrize("flavour", ["plain", "idempotent"])
def test_lookup_unsupported_raises(tmp_path: Path, flavour) -> None:
    with FakePaymentsServer(tmp_path / "p.jsonl", flavour=flavour) as srv:
        refund(srv.url, "o-1", 5, idempotency_key="k1")
        with pytest.raises(PaymentsError) as info:
            find_refund(srv.url, "k1")
        assert info.value.status == 501


def test_bad_request_is_logged_and_creates_nothing(tmp_path: Path) -> None:
    import urllib.request

    with FakePaymentsServer(tmp_path / "p.jsonl") as srv:
        req = urllib.request.Request(f"{srv.url}/refunds", data=b"{nope", method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        info.value.close()
        assert info.value.code == 400
        [line] = srv.requests()
        assert line["status"] == 400 and line["created"] is False
        assert srv.refunds() == []


def test_health_is_logged_but_not_a_refund(tmp_path: Path) -> None:
    import json
    import urllib.request

    with FakePaymentsServer(tmp_path / "p.jsonl") as srv:
        with urllib.request.urlopen(f"{srv.url}/health", timeout=10) as resp:
            assert json.loads(resp.read()) == {"ok": True}
        refund(srv.url, "o-1", 5, idempotency_key="k1")
        assert [(ln["method"], ln["path"]) for ln in srv.requests()] == [
            ("GET", "/health"),
            ("POST", "/refunds"),
        ]
        assert len(srv.refunds()) == 1


def test_restart_keeps_deduplicating(tmp_path: Path) -> None:
    log = tmp_path / "p.jsonl"
    with FakePaymentsServer(log, flavour="lookup") as srv:
        first = refund(srv.url, "o-1", 5, idempotency_key="k1")
    with FakePaymentsServer(log, flavour="lookup") as srv:
        assert find_refund(srv.url, "k1") == first
        again = refund(srv.url, "o-1", 5, idempotency_key="k1")
        assert again == first
        assert len(_posts(srv.requests())) == 2
        assert srv.refunds() == [first]


def test_read_log_ignores_torn_last_line_and_restart_repairs_it(tmp_path: Path) -> None:
    log = tmp_path / "p.jsonl"
    with FakePaymentsServer(log) as srv:
        first = refund(srv.url, "o-1", 5, idempotency_key="k1")
    with open(log, "a", encoding="utf-8") as f:
        f.write('{"ts": 1, "meth')
    assert len(read_log(log)) == 1
    with FakePaymentsServer(log) as srv:
        assert refund(srv.url, "o-1", 5, idempotency_key="k1") == first
    assert len(_posts(read_log(log))) == 2


def test_subprocess_mode(tmp_path: Path) -> None:
    log = tmp_path / "p.jsonl"
    port_file = tmp_path / "port"
    env = children.child_env()
    cmd = [
        sys.executable, "-m", "durably.testing.payments",
        "--log", str(log), "--flavour", "idempotent", "--port", "0",
        "--port-file", str(port_file),
    ]  # fmt: skip
    with subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE) as proc:
        try:
            deadline = time.monotonic() + 15
            while not port_file.exists():
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "server never wrote its port file"
                time.sleep(0.02)
            url = f"http://127.0.0.1:{int(port_file.read_text())}"
            made = refund(url, "o-1", 5, idempotency_key="k1")
            assert refund(url, "o-1", 5, idempotency_key="k1") == made
            assert len(_posts(read_log(log))) == 2
            assert refunds_in_log(log) == [made]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_max_in_flight_sees_concurrency(tmp_path: Path) -> None:
    with FakePaymentsServer(tmp_path / "p.jsonl", delay=0.2) as srv:
        errors: list[BaseException] = []

        def call(i: int) -> None:
            try:
                refund(srv.url, f"o-{i}", 1, idempotency_key=f"k{i}")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert srv.max_in_flight == 3
        assert len(srv.refunds()) == 3


def test_concurrent_same_key_creates_one_refund(tmp_path: Path) -> None:
    with FakePaymentsServer(tmp_path / "p.jsonl", delay=0.1) as srv:
        results: list[dict[str, object]] = []

        def call() -> None:
            results.append(refund(srv.url, "o-1", 1, idempotency_key="same"))

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 4
        assert len({r["refund_id"] for r in results}) == 1
        assert len(srv.refunds()) == 1
