"""The run's declared interface: no module but workflow_run.py reaches into a Run's internals.

Parsed with the standard library's ``ast``: an attribute of the run that is not
part of its interface, used anywhere else in src/durably, fails here with its place.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "durably"

#: Names other modules give a Run.
RUN_NAMES = {"run", "live", "parent"}

#: What used to be reached into before the run had one write path and one state.
INTERNALS = {
    "services",
    "pending",
    "replayer",
    "store_op",
    "take_pending",
    "lost",
    "abandoned",
    "retired",
    "cancel_requested",
    "cancel_delivered",
}


def test_no_module_reaches_into_a_run() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "workflow_run.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            if node.value.id not in RUN_NAMES:
                continue
            if node.attr.startswith("_") or node.attr in INTERNALS:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []


def test_no_weak_side_tables_keyed_by_run() -> None:
    """Run-local state lives in ``Run.local``, not in module-level WeakKeyDictionaries."""
    users = [
        str(p.relative_to(SRC))
        for p in sorted(SRC.rglob("*.py"))
        if "WeakKeyDictionary" in p.read_text()
    ]
    assert users == []
