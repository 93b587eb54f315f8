"""Write the golden archives again: run each example on a fresh SQLite file and export it.

    python -m tests.golden.regenerate [EXAMPLE...]

Each example's ``main(database)`` runs against the fake model server, as
``python examples/<name>.py`` does; its database is then exported, as
``durably export`` would, to ``tests/golden/<name>.jsonl``.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

import durably
from durably import archive
from durably.storage import create_store
from tests import golden


def regenerate(name: str) -> Path:
    """Run example ``name`` on a fresh database and write its golden archive."""
    module = golden.load(name)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'golden.db'}"
        with contextlib.redirect_stdout(io.StringIO()):
            module.main(url)
        store = create_store(url, create=False)
        store.open()
        try:
            workflows = store.export_workflows(store.export_ids(None, None))
            head = archive.header(durably.__version__, store.schema_version())
        finally:
            store.close()
    path = golden.archive_of(name)
    with open(path, "w", encoding="utf-8") as out:
        archive.write(out, head, workflows)
    return path


def main(argv: list[str]) -> int:
    for name in argv or list(golden.EXAMPLES):
        if name not in golden.EXAMPLES:
            sys.stderr.write(f"unknown example {name!r}; known: {', '.join(golden.EXAMPLES)}\n")
            return 2
        print(f"wrote {regenerate(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
