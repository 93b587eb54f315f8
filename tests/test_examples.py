"""Each example under examples/ runs as ``python examples/X.py`` against the fake model
server and prints its answer; a second run of the same workflow asks the model nothing."""

from __future__ import annotations

import subprocess

import pytest

from tests import children

REPO = children.REPO
EXAMPLES = {
    "agent_openai.py": "model requests: 2",
    "agent_anthropic.py": "model requests: 2 to /v1/messages",
    "pydantic_ai_agent.py": "model requests: 2",
    "openai_agents_sdk.py": "model requests: 2 to /v1/responses",
}


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in (REPO / "examples").glob("*.py")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_example_runs_and_prints_its_result(name: str) -> None:
    env = children.child_env(drop=("DURABLY_", "OPENAI_"))
    done = subprocess.run(
        children.python(str(REPO / "examples" / name)),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "answer: Order A1 has shipped.", done.stdout
    assert lines[1] == EXAMPLES[name], done.stdout
    # the second run returns the journaled answer: no model request is made again
    assert lines[2] == "run again: Order A1 has shipped. (model requests: 2)", done.stdout
    if name == "agent_anthropic.py":  # streamed: the answer arrived in pieces, in order
        assert lines[3] == "streamed live: ['Order A1', ' has shi', 'pped.']", done.stdout
