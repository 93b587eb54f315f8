"""``import durably`` loads the engine only; agents, model SDKs and the server load when used.

Behaviour, not timing: each check runs a fresh interpreter (``python -X importtime``,
so the import really happens from scratch) and looks at ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess

from durably.cli import group
from tests import children

HEAVY = ("openai", "rich", "pydantic_ai", "agents", "starlette", "anthropic")


def _modules_after(code: str) -> list[str]:
    """The top-level and durably module names loaded by ``code`` in a new interpreter."""
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        children.python("-X", "importtime", "-c", script),
        env=children.child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "durably" in proc.stderr, "python -X importtime printed no line for durably"
    loaded: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return loaded


def test_import_durably_loads_no_agent_sdk_cli_or_server_module() -> None:
    loaded = _modules_after("import durably")
    assert "durably" in loaded
    for name in HEAVY:
        assert name not in loaded, f"import durably loaded {name!r}"
    for name in ("click", "pydantic", "durably.agents", "durably.server"):
        assert name not in loaded, f"import durably loaded {name!r}"
    # the package metadata (for __version__) and OpenTelemetry load when used
    for name in ("importlib.metadata", "opentelemetry", "opentelemetry.trace"):
        assert name not in loaded, f"import durably loaded {name!r}"


def test_the_version_is_read_on_first_use_and_kept() -> None:
    loaded = _modules_after(
        "import durably\n"
        "from importlib import metadata\n"
        "assert durably.__version__ == metadata.version('durably'), durably.__version__\n"
        "assert '__version__' in vars(durably) and '__version__' in dir(durably)\n"
        "from durably import __version__\n"
        "assert __version__ is durably.__version__"
    )
    assert "importlib.metadata" in loaded


def test_lazy_names_resolve_to_the_agents_objects() -> None:
    loaded = _modules_after(
        "import durably\n"
        "from durably.agents import agent, durable_client, tools\n"
        "assert durably.Agent is agent.Agent and durably.AgentResult is agent.AgentResult\n"
        "assert durably.llm is durable_client.llm and durably.tool is tools.tool\n"
        "from durably import Agent\n"
        "assert Agent is agent.Agent"
    )
    assert "durably.agents" in loaded


def test_durably_help_loads_no_agent_sdk_or_server_module() -> None:
    loaded = _modules_after(
        "import sys\n"
        "from durably import cli\n"
        "sys.argv = ['durably', '--help']\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit as exit_:\n"
        "    assert exit_.code in (0, None), exit_.code\n"
    )
    for name in ("openai", "pydantic_ai", "agents", "starlette", "anthropic", "durably.server"):
        assert name not in loaded, f"durably --help loaded {name!r}"
    for name in ("importlib.metadata", "opentelemetry"):  # --version reads the metadata
        assert name not in loaded, f"durably --help loaded {name!r}"
    # The listing comes from the group's table (durably.cli.group): no command's module
    # loads, nor what only commands use (rich, the crash kit, the agents' approvals).
    for name in ("rich", "durably.agents", "durably.testing", "durably.admin", "durably.cli.base"):
        assert name not in loaded, f"durably --help loaded {name!r}"
    commands = {module for module, _, _ in group.COMMANDS.values()}
    assert not commands & set(loaded), f"durably --help loaded {commands & set(loaded)}"


def test_completing_a_command_name_loads_no_command_module() -> None:
    loaded = _modules_after(
        "import contextlib, io, os, sys\n"
        "from durably import cli\n"
        "os.environ.update(_DURABLY_COMPLETE='zsh_complete', COMP_WORDS='durably w',"
        " COMP_CWORD='1')\n"
        "sys.argv = ['durably']\n"
        # a text stream over bytes, as a terminal's: click 8.5 writes the completions as bytes
        "out = io.TextIOWrapper(io.BytesIO(), encoding='utf-8')\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        "        cli.main(prog_name='durably')\n"
        "    except SystemExit as exit_:\n"
        "        assert exit_.code in (0, None), exit_.code\n"
        "out.flush()\n"
        "text = out.buffer.getvalue().decode()\n"
        "assert 'workers' in text.split(), text\n"
    )
    commands = {module for module, _, _ in group.COMMANDS.values()}
    assert not commands & set(loaded), f"completion loaded {commands & set(loaded)}"
    assert "rich" not in loaded


def test_unknown_attribute_is_an_attribute_error() -> None:
    import durably

    try:
        durably.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("durably.NoSuchThing did not raise AttributeError")
