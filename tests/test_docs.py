"""The docs run as written: every fenced block of README.md and docs/*.md is a test.

Each ```python block runs in a fresh temporary directory, in its own process,
with a timeout, exactly as written. A block may be prefixed, only where the
Markdown says so in an HTML comment on the line before its fence:

- ``<!-- docs-test: setup=payments -->`` prepends the named stand-ins below
  (comma-separated) for the services a reader brings (a payments client, an
  orders API) or for state the block expects (pending approvals);
- ``<!-- docs-test: continues -->`` prepends the previous Python block of the
  same file (and whatever that one was prefixed with), for a block that reads
  as the next lines of an earlier one;
- ``<!-- docs-test: syntax-only=REASON -->`` only compiles a block that needs a
  real, paid API. Such blocks are counted in
  ``test_syntax_only_blocks_are_marked_and_few`` (none today).

An unmarked block that does not run fails its test. No block is ever skipped.
The model endpoint every block sees is ``OPENAI_BASE_URL`` pointing at a closed
port with a dummy key: a block that would pay for a model call fails instead.

``bash`` (and unlabelled) blocks are checked for what can be checked without a
server: every ``durably ...`` command line parses against the real command
line (the subcommand exists, its options exist, its arguments fit their types),
and every ``pip install`` extra exists in pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import click
import pytest

from tests import children

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 180  # seconds per block; a block that runs durably.testing.crash_points takes ~10 s

FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}


# --- stand-ins, prepended only to blocks that name them ------------------------------------------

SETUPS: dict[str, str] = {
    # Your payment service's client: one refund per idempotency key, and a lookup by key.
    "payments": """
class _Payments:
    def __init__(self):
        self.by_key = {}

    def refund(self, order_id, amount, idempotency_key):
        n = len(self.by_key) + 1
        return self.by_key.setdefault(
            idempotency_key, {"refund_id": f"re_{n}", "order_id": order_id, "amount": str(amount)}
        )

    def lookup(self, idempotency_key):
        return self.by_key.get(idempotency_key)

    find_refund = lookup


payments = _Payments()
""",
    # Your orders API.
    "orders": """
class _Orders:
    async def get(self, order_id):
        return {"order_id": order_id, "status": "shipped"}


orders = _Orders()
""",
    # Steps a trip-booking workflow calls.
    "travel": """
import durably


@durably.step
async def book_flight(trip_id: str) -> dict:
    return {"id": f"FL-{trip_id}"}


@durably.step
async def cancel_flight(flight_id: str) -> None:
    pass


@durably.step
async def book_hotel(trip_id: str) -> dict:
    return {"id": f"HT-{trip_id}"}
""",
    # Steps a checkout workflow calls.
    "shop": """
import durably


@durably.step
async def charge_card(order_id: str, cents: int) -> dict:
    return {"charge": order_id, "cents": cents}


@durably.step
async def refund_card(order_id: str, cents: int) -> None:
    pass


@durably.step
async def hold_deposit(order_id: str, cents: int) -> None:
    pass


@durably.step
async def refund_deposit(order_id: str, cents: int) -> None:
    pass


@durably.step
async def ship(order_id: str) -> str:
    return f"shipped {order_id}"
""",
    # A module myapp.agents with a refund workflow that logs each refund request to
    # payments.jsonl in the crash tool's scenario directory.
    "myapp": '''
import pathlib

pathlib.Path("myapp").mkdir()
pathlib.Path("myapp/__init__.py").write_text("")
pathlib.Path("myapp/agents.py").write_text("""
import json, os, pathlib
import durably


@durably.step
def issue_refund(ticket_id: str) -> dict:
    key = durably.idempotency_key()
    log = pathlib.Path(os.environ.get("DURABLY_SCENARIO_DIR", ".")) / "payments.jsonl"
    with open(log, "a") as fh:
        fh.write(json.dumps({"idempotency_key": key}) + "\\\\n")
    return {"refund_id": "re_" + key}


@durably.workflow
async def refund_agent(ticket_id: str) -> dict:
    return await issue_refund(ticket_id)
""")
''',
    # A fake model server (chat completions and the Responses API) as OPENAI_BASE_URL, for the
    # framework blocks: turn 0 calls lookup_order(order_id="A1"), turn 1 answers. The Agents
    # SDK's trace export (to api.openai.com) is switched off by its own environment variable.
    "fake_model": """
import os

from durably.testing.models import FakeModelServer, by_turn, call, text, tool_calls

_server = FakeModelServer(
    by_turn([tool_calls(call("lookup_order", {"order_id": "A1"})), text("Order A1 has shipped.")])
).start()
os.environ["OPENAI_BASE_URL"] = _server.url
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
""",
    # Two agent workflows parked on an approval in sqlite:///agents.db (ticket-4417, ticket-4418).
    "pending_approvals": """
import asyncio
import time

import durably
from openai import AsyncOpenAI
from durably.testing.models import FakeModelServer, by_turn, call, text, tool_calls


@durably.tool(requires_approval=lambda args: args["cents"] > 10_000)
async def _refund(order_id: str, cents: int) -> dict:
    return {"order_id": order_id, "cents": cents}


_server = FakeModelServer(
    by_turn([tool_calls(call("_refund", {"order_id": "A1", "cents": 25_000})), text("done")])
).start()
_agent = durably.Agent(
    client=AsyncOpenAI(base_url=_server.url, api_key="test", max_retries=0),
    model="gpt-4.1-mini",
    tools=[_refund],
)


@durably.workflow
async def _support(ticket: str) -> str:
    return (await _agent.run(ticket)).output


async def _park() -> None:
    async with durably.Engine("sqlite:///agents.db", hold_seconds=0.05) as engine:
        tickets = ("ticket-4417", "ticket-4418")
        handles = [await engine.start(_support, t, workflow_id=t) for t in tickets]
        deadline = time.monotonic() + 60
        while [await h.status() for h in handles] != ["waiting", "waiting"]:
            assert time.monotonic() < deadline, "the setup's agents did not park"
            await asyncio.sleep(0.05)
    await _agent.client.close()


asyncio.run(_park())
_server.stop()
""",
}


# --- reading the blocks --------------------------------------------------------------------------


@dataclasses.dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    setups: tuple[str, ...] = ()
    continues: bool = False
    syntax_only: str | None = None

    @property
    def where(self) -> str:
        return f"{_name(self.path)}:{self.line}"


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _options(text: str, where: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in text.split(";"):
        key, _, value = item.strip().partition("=")
        if key not in ("setup", "continues", "syntax-only"):
            raise ValueError(f"{where}: unknown docs-test option {key!r}")
        options[key] = value.strip()
    if "syntax-only" in options and not options["syntax-only"]:
        raise ValueError(f"{where}: syntax-only needs a reason (syntax-only=needs a paid API)")
    return options


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, with the docs-test marker before each."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, ticks, lang = i, fence.group(1), fence.group(2).lower()
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != ticks:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{_name(path)}:{start + 1}: unclosed code fence")
        i += 1
        marker = MARKER.match(lines[start - 1].strip()) if start > 0 else None
        where = f"{_name(path)}:{start + 1}"
        opts = _options(marker.group(1), where) if marker else {}
        setups = tuple(s.strip() for s in opts.get("setup", "").split(",") if s.strip())
        unknown = [s for s in setups if s not in SETUPS]
        if unknown:
            raise ValueError(f"{where}: no stand-in named {unknown} (known: {sorted(SETUPS)})")
        blocks.append(
            Block(
                path,
                start + 1,
                lang,
                "\n".join(body) + "\n",
                setups=setups,
                continues="continues" in opts,
                syntax_only=opts.get("syntax-only"),
            )
        )
    return blocks


ALL_BLOCKS = [b for path in FILES for b in read_blocks(path)]
PYTHON = [b for b in ALL_BLOCKS if b.lang in ("python", "py")]
SHELL = [b for b in ALL_BLOCKS if b.lang in SHELL_LANGS]


def program(block: Block) -> str:
    """The block's code with what its marker asks for in front of it."""
    parts: list[str] = []
    if block.continues:
        earlier = [b for b in PYTHON if b.path == block.path and b.line < block.line]
        if not earlier:
            raise ValueError(f"{block.where}: 'continues' but no Python block comes before it")
        parts.append(program(earlier[-1]))
    for name in block.setups:
        parts.append(f"# --- docs-test stand-in: {name} ---\n{SETUPS[name].strip()}\n")
    parts.append(f"# --- {block.where} ---\n{block.code}")
    return "\n".join(parts)


def _env(cwd: Path) -> dict[str, str]:
    model = {
        "OPENAI_API_KEY": "sk-docs-test-not-a-key",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # nothing listens: no model call is paid
    }
    # modules a block writes (myapp) import in its child processes
    return children.child_env(model, drop=("DURABLY_", "OPENAI_"), paths=[cwd])


# --- Python blocks -------------------------------------------------------------------------------


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    code = program(block)
    if block.syntax_only is not None:
        compile(code, block.where, "exec")
        return
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = f"{exc.stdout!r}\n{exc.stderr!r}"  # bytes or None: what it printed so far
        pytest.fail(f"{block.where} did not finish in {TIMEOUT} s:\n{output}")
    report = f"{block.where} exited {proc.returncode}\n--- code\n{code}\n--- stdout\n{proc.stdout}"
    assert proc.returncode == 0, f"{report}\n--- stderr\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, f"{report}\n--- stderr\n{proc.stderr}"


def test_syntax_only_blocks_are_marked_and_few() -> None:
    """Blocks that are only compiled are those that need a paid API, and say so."""
    marked = [f"{b.where} ({b.syntax_only})" for b in PYTHON if b.syntax_only is not None]
    assert len(marked) <= 2, marked
    assert all("API" in b.syntax_only for b in PYTHON if b.syntax_only is not None), marked


def test_there_are_python_blocks_to_run() -> None:
    """The extraction finds the blocks (a broken fence pattern would make every test vacuous)."""
    readme = [b for b in PYTHON if b.path.name == "README.md"]
    assert len(readme) >= 4 and len(PYTHON) >= 12, [b.where for b in PYTHON]


def test_the_quick_start_is_one_program() -> None:
    """The quick start's engine part continues the script part: one database, one workflow."""
    readme = [b for b in PYTHON if b.path.name == "README.md"]
    assert readme[1].continues, readme[1].where
    assert "asyncio.run(" in readme[1].code and "durably.run(" in readme[0].code


def test_durably_names_in_the_docs_exist() -> None:
    """Every ``durably.x.y`` named in inline code resolves (a renamed API breaks this test)."""
    import importlib

    missing: list[str] = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for span in re.findall(r"`[^`\n]+`", text):
            for dotted in re.findall(r"(?<![/\w])durably(?:\.[A-Za-z_]\w*)+", span):
                parts = dotted.split(".")
                if parts[-1] in ("db", "md", "py", "log", "jsonl", "json", "toml"):
                    continue  # a file name such as durably.db
                for cut in range(len(parts), 0, -1):
                    try:
                        obj: object = importlib.import_module(".".join(parts[:cut]))
                    except ImportError:
                        continue
                    break
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    missing.append(f"{_name(path)}: {dotted}")
    assert missing == [], missing


# --- shell blocks --------------------------------------------------------------------------------


def shell_commands(code: str, lang: str = "bash") -> list[list[str]]:
    """Each simple command of a shell block, as tokens; ``[--opt x]`` brackets are dropped.

    In a ``console`` block only ``$ `` lines are commands (the rest is output).
    Lines ending in a backslash continue on the next line.
    """
    commands: list[list[str]] = []
    joined: list[str] = []
    for raw in code.splitlines():
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + raw.strip()
        else:
            joined.append(raw.strip())
    for line in joined:
        if lang == "console" and not line.startswith("$ "):
            continue
        line = line.removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            if line.startswith(("durably", "pip")):
                raise
            continue  # not a command we check (output, prose in an unlabelled block)
        current: list[str] = []
        for token in tokens:
            if token in ("|", "||", "&&", ";"):
                commands.append(current)
                current = []
            else:
                if token.startswith("[--"):  # an optional part, as in `durably list [--status X]`
                    token = token[1:]
                if token.endswith("]") and "[" not in token:
                    token = token[:-1]
                current.append(token)
        commands.append(current)
    return [c for c in commands if c]


def parse_durably(args: list[str]) -> None:
    """Parse ``durably ARGS`` with the real command line, invoking nothing.

    Raises click.UsageError (unknown command or option, bad argument count or
    type). ``--help`` and ``--version`` end parsing successfully.
    """
    from durably.cli import main

    cmd: click.Command = main
    name = "durably"
    parent: click.Context | None = None
    rest = list(args)
    try:
        while True:
            ctx = cmd.make_context(name, rest, parent=parent)
            if not isinstance(cmd, click.Group):
                return
            # what follows the group's own options (click < 8.2 calls it protected_args)
            protected = getattr(ctx, "_protected_args", None)
            rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
            if not rest:
                return
            found, sub, rest = cmd.resolve_command(ctx, rest)
            assert found is not None and sub is not None
            name, cmd, parent = found, sub, ctx
    except click.exceptions.Exit as exc:
        if exc.exit_code != 0:
            raise


def _extras() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(pyproject["project"]["optional-dependencies"])


@pytest.mark.parametrize("block", SHELL, ids=[b.where for b in SHELL])
def test_shell_block_commands_parse(block: Block) -> None:
    checked = 0
    for command in shell_commands(block.code, block.lang):
        if command[0] == "durably":
            try:
                parse_durably(command[1:])
            except click.UsageError as exc:
                pytest.fail(f"{block.where}: `{shlex.join(command)}` does not parse: {exc}")
            checked += 1
        elif command[:2] == ["pip", "install"]:
            for spec in command[2:]:
                extras = re.findall(r"\[([^\]]*)\]", spec)
                for extra in (e.strip() for group in extras for e in group.split(",")):
                    assert extra in _extras(), f"{block.where}: no extra {extra!r} in pyproject"
    if block.lang in ("", "console"):
        return  # unlabelled blocks (diagrams) are checked only for the commands they hold
    assert checked or "pip" in block.code or "pytest" in block.code, (
        f"{block.where}: a shell block with nothing checkable:\n{block.code}"
    )


def test_a_broken_command_fails_the_check() -> None:
    """The parser the shell check relies on rejects what it should."""
    assert shell_commands("durably list [--status failed] | durably \\\n  show wf-1  # x") == [
        ["durably", "list", "--status", "failed"],
        ["durably", "show", "wf-1"],
    ]
    assert shell_commands("$ durably workers\nit's running", "console") == [["durably", "workers"]]
    parse_durably(["--database", "sqlite:///x.db", "show", "wf-1"])
    parse_durably(["review", "resolve", "wf-1", "2", "--retry"])
    parse_durably(["worker", "app", "--database", "sqlite:///x.db"])  # after the command too
    for bad in (
        ["no-such-command"],
        ["show"],  # a missing argument
        ["worker", "app", "--databse", "sqlite:///x.db"],  # a typo of an option
        ["list", "--no-such-option"],
    ):
        with pytest.raises(click.UsageError):
            parse_durably(bad)


def test_a_broken_python_block_fails(tmp_path: Path) -> None:
    """An unmarked block that raises is a failure, not a skip: the runner itself is checked."""
    doc = tmp_path / "x.md"
    doc.write_text(
        textwrap.dedent(
            """\
            ```python
            import durably
            durably.no_such_thing()
            ```
            """
        )
    )
    [block] = read_blocks(doc)
    with pytest.raises(AssertionError, match=r"x\.md:1 exited 1"):
        test_python_block_runs_as_written(block, tmp_path)
