"""Golden journals: archives of the examples' workflows that today's code must keep replaying.

``tests/test_golden.py`` replays each ``tests/golden/<example>.jsonl`` against
``examples/<example>.py`` on every commit. Regenerate them (after a change to
an example that changes its durable calls on purpose) with::

    python -m tests.golden.regenerate
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from durably.testing import FakeModelServer

GOLDEN = Path(__file__).resolve().parent
EXAMPLES_DIR = GOLDEN.parents[1] / "examples"


def _openai(server: FakeModelServer) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.url, api_key="fake", max_retries=0)


def _anthropic(server: FakeModelServer) -> Any:
    from anthropic import AsyncAnthropic

    return AsyncAnthropic(base_url=server.anthropic_url, api_key="fake", max_retries=0)


#: Each example (a module of examples/) with the client its ``build(client)`` takes.
EXAMPLES: dict[str, Callable[[FakeModelServer], Any]] = {
    "agent_openai": _openai,
    "agent_anthropic": _anthropic,
    "pydantic_ai_agent": _openai,
    "openai_agents_sdk": _openai,
}


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (once per process)."""
    if str(EXAMPLES_DIR) not in sys.path:
        sys.path.insert(0, str(EXAMPLES_DIR))
    return importlib.import_module(name)


def archive_of(name: str) -> Path:
    """Where the golden archive of example ``name`` is kept."""
    return GOLDEN / f"{name}.jsonl"
