"""Spawn agent runner children (real processes on a real SQLite file) and read their output."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests import children

REPO = children.REPO
TIMEOUT = 60.0
MODEL_URL_ENV = "AGENTKIT_MODEL_URL"
EFFECTS_ENV = "AGENTKIT_EFFECTS"
DELAYS_ENV = "AGENTKIT_DELAYS"
MAX_TOKENS_ENV = "AGENTKIT_MAX_TOKENS"


def child_env(
    model_url: str, effects: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Our environment, no crash plan unless given, the repo importable, the model server named."""
    return children.child_env(
        {MODEL_URL_ENV: model_url, EFFECTS_ENV: str(effects), **(extra or {})}
    )


def run(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a child to its end (or its SIGKILL)."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def runner(db: Path, workflow_id: str, text: str, env: Mapping[str, str], *extra: str) -> Any:
    """Run ``tests.agentkit.runner``; its JSON report, or None when it was killed."""
    argv = ["-m", "tests.agentkit.runner", "--db", str(db), "--id", workflow_id, "--input", text]
    done = run([*argv, *extra], env)
    if done.returncode < 0:
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
