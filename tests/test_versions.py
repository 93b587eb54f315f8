"""Versioned workflows across deploys, with real worker processes.

``@durably.workflow(version="3")``: a workflow started by version 3 is claimed and
resumed only by code that declares version 3. A worker of version 4 leaves it
alone (it neither runs nor fails it); ``durably list --stranded`` shows it, with
its version and what to do, while no running worker has version 3; a worker of
version 3 started later finishes it. Each version is an ``app.py`` of its own in
tmp_path, run by ``durably worker app`` as a deploy would. Both backends.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner

from durably import Client, cli
from tests import children

APP = """
import durably

@durably.step
def tag() -> str:
    return "v{version}"

@durably.workflow(name="ver-flow", version="{version}")
async def flow(order_id: str) -> str:
    first = await tag()
    go = await durably.wait_for_signal("go")
    return f"{{order_id}} started {{first}} {{go}} finished v{version}"
"""


def _app(root: Path, version: str) -> Path:
    code = root / f"v{version}"
    code.mkdir()
    (code / "app.py").write_text(textwrap.dedent(APP.format(version=version)))
    return code


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextmanager
def worker(url: str, code: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``durably worker app`` run from ``code`` until the block ends (SIGTERM, exit 0)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            children.durably_cli(url, "worker", "app", "--poll", "0.05"),
            stdout=out,
            stderr=out,
            cwd=code,
            env=children.child_env(paths=[code, children.SRC]),
        )
    try:
        wait_for(lambda: "workflows: ver-flow" in log.read_text(), f"the worker in {code.name}")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()


def _start(url: str, code: Path, order_id: str, wid: str) -> None:
    """``durably start app:flow`` run from ``code``: the row gets that code's version."""
    proc = subprocess.run(
        children.durably_cli(
            url, "start", "app:flow", json.dumps([order_id]), "--id", wid, "--no-wait"
        ),
        cwd=code,
        env=children.child_env(paths=[code, children.SRC]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli.main, ["--database", url, *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_stranded_version_is_left_alone_listed_and_resumed_by_its_version(
    store_url: str, tmp_path: Path
) -> None:
    v3, v4 = _app(tmp_path, "3"), _app(tmp_path, "4")
    with worker(store_url, v3, tmp_path / "w3.log"), Client(store_url) as client:
        _start(store_url, v3, "A1", "old")
        wait_for(lambda: client.get_workflow("old").status == "waiting", "v3 to park it")
    with Client(store_url) as client:
        info = client.get_workflow("old")
        assert (info.version, info.source_hash is not None) == ("3", True)
        client.send_signal("old", "go", "yes")  # due now: any worker that may take it would
        claims_before = len(client.claims("old"))

    log4 = tmp_path / "w4.log"
    with worker(store_url, v4, log4), Client(store_url) as client:
        # v4 takes its own work, and looks past "old": it says so once it has seen it
        _start(store_url, v4, "B1", "new")
        wait_for(
            lambda: "waits for workflow 'ver-flow' version '3'" in log4.read_text(),
            "the v4 worker to pass over the v3 workflow",
        )
        wait_for(lambda: client.get_workflow("new").status == "waiting", "v4 to park its own")
        info = client.get_workflow("old")
        assert info.status == "waiting" and info.crash_count == 0 and info.error is None
        assert len(client.claims("old")) == claims_before  # never claimed by v4
        stranded = _cli(store_url, "list", "--stranded")
        as_json = CliRunner().invoke(
            cli.main, ["--database", store_url, "list", "--stranded", "--json"]
        )
    assert "old" in stranded and "ver-flow v3" in stranded, stranded
    assert not re.search(r"\bnew\b", stranded), stranded  # the v4 worker serves it
    assert (
        "no running worker has workflow 'ver-flow' version '3' "
        "(running workers have it at version '4')"
    ) in stranded, stranded
    assert "version='3')" in stranded and "durably cancel old" in stranded, stranded
    [record] = [json.loads(line) for line in as_json.output.splitlines()]
    assert record["workflow_id"] == "old" and record["version"] == "3"
    assert record["notes"][0].startswith("no running worker has workflow 'ver-flow' version '3'")

    with worker(store_url, v3, tmp_path / "w3b.log"), Client(store_url) as client:
        wait_for(lambda: client.get_workflow("old").finished, "v3 to finish it")
        info = client.get_workflow("old")
        assert info.status == "completed", info
        assert json.loads(info.output or "null") == "A1 started v3 yes finished v3"
        # now the v4 workflow is the stranded one: no v4 worker runs
        listed = _cli(store_url, "list", "--stranded")
    assert re.search(r"\bnew\b", listed) and "version='4'" in listed, listed
    assert not re.search(r"\bold\b", listed), listed


def test_without_a_version_the_stranded_note_asks_for_the_name_alone(
    store_url: str, tmp_path: Path
) -> None:
    with Client(store_url) as client:
        client.start("nobody-runs-this", 1, workflow_id="orphan")
    listed = _cli(store_url, "list", "--stranded", "--status", "pending")
    assert "no running worker has workflow 'nobody-runs-this'." in listed, listed
    assert "registers workflow 'nobody-runs-this' without a version" in listed, listed
    assert _cli(store_url, "list", "--stranded", "--status", "completed") == (
        "no stranded workflows"
    )


def test_a_start_by_name_without_the_code_gets_no_version_and_the_note_says_so(
    store_url: str, tmp_path: Path
) -> None:
    v3 = _app(tmp_path, "3")
    with Client(store_url) as client:
        client.start("ver-flow", "A1", workflow_id="by-name")  # this process lacks the code
        assert client.get_workflow("by-name").version is None
    with worker(store_url, v3, tmp_path / "w3.log"):
        listed = _cli(store_url, "list", "--stranded")
    assert (
        "no running worker has workflow 'ver-flow' (running workers have it at version '3')"
        in listed
    ), listed
    assert "gets no version: start it from code that has the versioned workflow" in listed, listed


def test_show_says_the_code_changed_since_the_workflow_started(
    store_url: str, tmp_path: Path
) -> None:
    v3 = _app(tmp_path, "3")
    with worker(store_url, v3, tmp_path / "w3.log"), Client(store_url) as client:
        _start(store_url, v3, "A1", "wf")
        wait_for(lambda: client.get_workflow("wf").status == "waiting", "v3 to park it")
        started_by = client.get_workflow("wf").source_hash
    changed = tmp_path / "v3-changed"
    changed.mkdir()
    source = (v3 / "app.py").read_text()
    (changed / "app.py").write_text(
        source.replace("    first = await tag()", "    first = await tag()  # a fix, same version")
    )
    with worker(store_url, changed, tmp_path / "w3c.log"), Client(store_url) as client:
        wait_for(lambda: len(client.executors()) == 1, "the changed worker to register")
        [here] = client.executors()
        [(_, version, now_hash)] = here.workflows
        assert version == "3" and now_hash not in (None, started_by)
        shown = _cli(store_url, "show", "wf")
        assert (
            f"note: other code: started by source {started_by}, workers have {now_hash} "
            "(its code changed since it started"
        ) in shown, shown
        client.send_signal("wf", "go", "yes")  # same version: the changed code finishes it
        wait_for(lambda: client.get_workflow("wf").finished, "the changed code to finish it")
        assert client.get_workflow("wf").status == "completed"


def test_resume_in_place_refuses_code_of_another_version(store_url: str, tmp_path: Path) -> None:
    """`durably resume ID MODULE` runs the workflow here: with another version's code it
    would wait forever for a claim it can never make, so it is refused, unchanged."""
    v3, v4 = _app(tmp_path, "3"), _app(tmp_path, "4")
    with worker(store_url, v3, tmp_path / "w3.log"), Client(store_url) as client:
        _start(store_url, v3, "A1", "wf")
        wait_for(lambda: client.get_workflow("wf").status == "waiting", "v3 to park it")
        client.cancel("wf")
        wait_for(lambda: client.get_workflow("wf").status == "cancelled", "v3 to cancel it")
    proc = subprocess.run(
        children.durably_cli(store_url, "resume", "wf", "app"),
        cwd=v4,
        env=children.child_env(paths=[v4, children.SRC]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, said
    assert "workflow 'wf' was started by workflow 'ver-flow' version '3'" in said, said
    assert "app registers it at version '4'" in said, said
    with Client(store_url) as client:
        assert client.get_workflow("wf").status == "cancelled"  # nothing changed
