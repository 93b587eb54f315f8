"""``durably.testing.replay``: today's code against recorded journals, in a test or in CI."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from pathlib import Path

from durably import rehearsal


def replay(
    archive: str | Path | None = None,
    *,
    app: str | Sequence[str] = (),
    database: str | None = None,
    status: str | None = None,
    ids: Sequence[str] = (),
    strict_replay: bool = False,
) -> rehearsal.Report:
    """Replay the workflows of ``archive`` (a ``durably export`` file), or those a live
    ``database`` holds (``ids``, else ``status``, else all), against the code of the
    modules ``app`` (imported first) and of this process.

    No step runs, nothing is written and no model is called: recorded results
    are returned, and each workflow stops where its journal ends. Returns a
    :class:`~durably.rehearsal.Report`; ``report.ok`` is False when today's code
    would stop any of them (``report.problems``, each with its seq and source
    line). A step called with other arguments is a problem with
    ``strict_replay`` (as under ``Engine(strict_replay=True)``), else one of
    ``report.warnings``. Call it outside an event loop.
    """
    if (archive is None) == (database is None):
        raise ValueError("replay() takes an archive or a database=, not both and not neither")
    for module in [app] if isinstance(app, str) else app:
        importlib.import_module(module)
    if archive is not None:
        if status is not None or ids:
            raise ValueError("status= and ids= select from a database=, not from an archive")
        recorded = rehearsal.from_archive(archive)
    else:
        assert database is not None
        recorded = rehearsal.from_database(database, status, ids)
    return asyncio.run(rehearsal.rehearse(recorded, strict_replay=strict_replay))
