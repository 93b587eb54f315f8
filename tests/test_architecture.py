"""The shape of src/durably: no import cycle among its modules, and no module too long.

Read with the standard library's ``ast``, without importing anything, so a cycle
that Python happens to tolerate today (because of the order modules load in) is
still found.

What counts as an import (judged, and kept so): a module-level ``import`` or
``from ... import``, including one inside a module-level ``try``/``if``/``with``.
Not counted: imports under ``if TYPE_CHECKING:`` (they never run) and imports
inside a function or class body (they run late, when every module is loaded, and
are how an optional dependency or a late registration is written). The late
imports that still close a cycle are listed in ``LATE_CYCLES``: that list may
only shrink.
"""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"

#: Lines above which a module is reported (the aim of docs: about 600).
REPORT_OVER = 600
#: No module may be longer than this; it holds today for the modules not yet split
#: (engine.py, over 800). Lower it when it is split, never raise it.
CEILING = 900

#: Cycles that exist only through imports inside functions (counted separately so
#: they stay visible). Each is a pair of modules that call into each other at run
#: time; this set may only shrink.
LATE_CYCLES: set[frozenset[str]] = {
    frozenset({"durably.workflow_run", "durably.step_call"}),
}


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Every module of src/durably by dotted name, with its file and whether a package."""
    found = {}
    for path in sorted((SRC / "durably").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _imports(
    name: str, path: pathlib.Path, package: bool, modules: set[str], late: bool
) -> set[str]:
    """The durably modules ``name`` imports at module level (and in functions if ``late``)."""
    here = name.split(".") if package else name.split(".")[:-1]
    out: set[str] = set()

    def target(node: ast.ImportFrom) -> str:
        if node.level:
            base = here[: len(here) - (node.level - 1)]
            return ".".join([*base, *([node.module] if node.module else [])])
        return node.module or ""

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = target(node)
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    out.add(sub if sub in modules else module)
            elif isinstance(node, ast.If | ast.With | ast.AsyncWith):
                visit(node.body)
                visit(getattr(node, "orelse", []))
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif late and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return {m for m in out if m in modules and m != name}


def _graph(late: bool) -> dict[str, set[str]]:
    modules = _modules()
    names = set(modules)
    return {n: _imports(n, p, pkg, names, late) for n, (p, pkg) in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


#: Private names read off something other than ``self``/``cls``, by module. Each is read
#: in the module that defines it (a handle of the engine, a server's own app); this set
#: may only shrink. queues.py and leases.py, which
#: used to read Engine's and Client's private attributes, are given what they need.
PRIVATE_READS = {
    ("durably.engine", "engine._changes"),
    ("durably.engine", "engine._tasks"),
    ("durably.testing.models", "app._answer"),
    ("durably.testing.payments", "app._enter"),
    ("durably.testing.payments", "app._exit"),
    ("durably.testing.payments", "app._handle"),
    # CPython's documented frame access, one call cheaper than inspect.currentframe() (whose
    # f_back chain makes a frame object per frame): a replayed call notes its line with it
    ("durably.workflow_run", "sys._getframe"),
}


def test_no_module_reads_private_attributes_of_another() -> None:
    found = set()
    for name, (path, _) in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                continue
            if _is_super(node.value):  # an override calling its own class's version
                continue
            found.add((name, ast.unparse(node)))
    assert found <= PRIVATE_READS, f"new reads of private attributes: {found - PRIVATE_READS}"


def _is_super(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def test_the_checker_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle_among_modules() -> None:
    cycles = _cycles(_graph(late=False))
    assert cycles == [], f"module-level import cycles in src/durably: {cycles}"


def test_late_imports_close_no_new_cycle() -> None:
    cycles = {frozenset(c) for c in _cycles(_graph(late=True))}
    assert cycles <= LATE_CYCLES, f"new cycles through imports in functions: {cycles - LATE_CYCLES}"


def test_no_module_over_the_ceiling() -> None:
    sizes = {
        name: len(path.read_text(encoding="utf-8").splitlines())
        for name, (path, _) in _modules().items()
    }
    long = sorted((n, s) for n, s in sizes.items() if s > REPORT_OVER)
    print(f"modules over {REPORT_OVER} lines: {long}")
    assert [n for n, s in long if s > CEILING] == [], long


def test_tests_spawn_children_through_one_helper() -> None:
    """tests/children.py builds every child's environment; no other test file copies ours."""
    tests = SRC.parent / "tests"
    builders = sorted(
        str(path.relative_to(tests))
        for path in tests.rglob("*.py")
        if path.name not in ("children.py", "test_architecture.py")
        and any(
            marker in path.read_text(encoding="utf-8")
            for marker in ("PYTHONPATH", "os.environ.items()", "**os.environ")
        )
    )
    assert builders == [], f"build the environment with tests.children.child_env: {builders}"
