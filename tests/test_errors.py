"""Errors say what is so: each distinct condition has its own class, and a class its message."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import errors, storage
from durably.storage import base, create_store


@durably.workflow
async def finishes() -> str:
    return "done"


def test_an_error_raised_without_a_message_says_its_docstring() -> None:
    assert str(errors.WorkflowFinished()) == (
        "The workflow has ended, so what was sent to it can never be received (a signal)."
    )
    assert str(errors.EngineNotOpen()) == "The engine is not open; use ``async with Engine(...)``."
    assert str(errors.StoreError("disk on fire")) == "disk on fire"  # a message wins
    assert str(errors.StepError("KeyError", "x")) == "KeyError: x"  # own __str__ kept


async def test_an_engine_not_open_says_so(sqlite_url: str) -> None:
    engine = durably.Engine(sqlite_url)
    with pytest.raises(errors.EngineNotOpen, match="not open"):
        engine.executor_id  # noqa: B018
    with pytest.raises(errors.EngineNotOpen, match="not open"):
        await engine.start(finishes)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("mysql://localhost/db", "unsupported database URL scheme 'mysql'"),
        ("sqlite://", "no file in sqlite URL"),
        ("sqlite:///x.db?synchronous=off", "synchronous='off'"),
        ("sqlite:///x.db?file_mode=0400", "file_mode='0400'"),
        ("postgresql://u@h/db?schema=a&schema=b", "schema= is given 2 times"),
        ("postgresql://u@h/db?schema=Bad-Name", "is not a schema name durably accepts"),
    ],
)
def test_a_bad_database_url_is_a_database_url_error(url: str, match: str) -> None:
    with pytest.raises(errors.DatabaseURLError, match=match):
        create_store(url)


def test_a_postgres_url_without_psycopg_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "durably.storage.postgres", raising=False)
    monkeypatch.delattr(storage, "postgres", raising=False)
    with pytest.raises(errors.BackendNotInstalled, match=r"pip install 'durably\[postgres\]'"):
        create_store("postgresql://u@h/db")


def test_resuming_a_workflow_that_did_not_fail_is_not_resumable(store_url: str) -> None:
    with durably.Client(store_url) as client:
        client.start(finishes, workflow_id="ended")  # pending: no worker runs it
    with durably.Client(store_url) as client:
        with pytest.raises(errors.NotResumable, match="only a failed, cancelled or diverged"):
            client.resume("ended")
        assert client.get_workflow("ended").status == "pending"


def _verb(store: base.Store, fn: Any, *args: Any) -> Any:
    op = base.Op(fn, args, write=True)
    store.run_batch([op])
    if op.error is not None:
        raise op.error
    return op.result


def test_pruning_an_unfinished_status_is_not_a_finished_status(store_url: str) -> None:
    store = create_store(store_url)
    store.open()
    try:
        with pytest.raises(errors.NotAFinishedStatus, match="'running' is not a finished"):
            _verb(store, store.prune, 1e12, "running", 10)
    finally:
        store.close()


def test_a_backup_onto_an_existing_file_is_a_backup_error(sqlite_url: str, tmp_path: Path) -> None:
    taken = tmp_path / "taken.db"
    taken.write_text("mine")
    store = create_store(sqlite_url)
    store.open()
    try:
        with pytest.raises(errors.BackupError, match="never overwrites a file"):
            store.backup(str(taken))
    finally:
        store.close()
    assert taken.read_text() == "mine"


def test_no_bare_durably_error_is_raised() -> None:
    """Each condition has its class: the base class itself is never raised."""
    src = Path(errors.__file__).parent
    bare = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = ast.unparse(node.exc.func)
                if name in ("DurablyError", "errors.DurablyError", "durably.DurablyError"):
                    bare.append(f"{path.relative_to(src)}:{node.lineno}")
    assert bare == []
