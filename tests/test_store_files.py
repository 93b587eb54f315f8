"""What durably leaves on disk and on screen: file modes, and URLs as they are shown."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import durably
from durably import errors
from durably.storage import create_store, postgres
from tests.test_store import Verbs, owned


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """The usual umask (022), under which a plain create gives 0644: world-readable."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def modes_while_open(url: str, path: Path) -> dict[str, int]:
    """The permission bits of the database, -wal and -shm, with the store open and written."""
    store = create_store(url)
    store.open()
    try:
        owned(Verbs(store), "wf-1")
        files = {"db": path, "wal": Path(f"{path}-wal"), "shm": Path(f"{path}-shm")}
        return {k: stat.S_IMODE(p.stat().st_mode) for k, p in files.items()}
    finally:
        store.close()


@pytest.mark.usefixtures("usual_umask")
def test_a_new_sqlite_database_and_its_wal_and_shm_are_private(tmp_path: Path) -> None:
    path = tmp_path / "private.db"
    assert modes_while_open(f"sqlite:///{path}", path) == {"db": 0o600, "wal": 0o600, "shm": 0o600}


@pytest.mark.usefixtures("usual_umask")
def test_the_url_can_ask_for_another_mode(tmp_path: Path) -> None:
    path = tmp_path / "group.db"
    got = modes_while_open(f"sqlite:///{path}?file_mode=0640", path)
    assert got == {"db": 0o640, "wal": 0o640, "shm": 0o640}


@pytest.mark.usefixtures("usual_umask")
def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    create_store(f"sqlite:///{path}?file_mode=0660").open()
    os.chmod(path, 0o644)
    assert modes_while_open(f"sqlite:///{path}", path)["db"] == 0o644


@pytest.mark.parametrize("mode", ["abc", "0999", "0200", "1777", "0o600x", ""])
def test_a_bad_mode_is_refused_with_its_name(tmp_path: Path, mode: str) -> None:
    with pytest.raises(errors.DurablyError, match=f"file_mode={mode!r}"):
        create_store(f"sqlite:///{tmp_path / 'x.db'}?file_mode={mode}")
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql:///orders?host=/run/postgresql",
            "postgresql:///orders?host=/run/postgresql",
        ),
        (
            "postgresql:///orders?host=/run/postgresql&password=pa55",
            "postgresql:///orders?host=/run/postgresql&password=***",
        ),
        ("postgres://app:pa55@db:6432/orders", "postgres://app:***@db:6432/orders"),
        ("postgresql://db.internal/orders", "postgresql://db.internal/orders"),
        ("postgresql:///orders", "postgresql:///orders"),
    ],
)
def test_postgres_urls_are_shown_as_written_without_passwords(url: str, shown: str) -> None:
    assert postgres.redact(url) == shown
    assert create_store(url).url == shown


def test_client_and_engine_show_the_url_as_written_without_the_password() -> None:
    url = "postgresql://app:pa55@/orders?host=/run/postgresql"
    shown = "postgresql://app:***@/orders?host=/run/postgresql"
    assert durably.Client(url).url == shown
    assert durably.Engine(url).url == shown
