"""A deploy while a workflow is parked: the step's recorded result meets changed code.

The story of issue 10: a workflow parked for approval after a step returned the
pydantic model ``app:Order``. While it waits, a new version of ``app`` is
deployed and a *new process* (a real one, with only that version's module on its
path) takes it up on approval:

- the class was renamed: the result decodes through the step's annotation and
  the workflow completes, without running the step again;
- the class gained a required field: the workflow stops ``diverged`` (not
  failed) with an error naming the seq, the step, the stored value's shape and
  today's type; a compatible version deployed later resumes it to the end.

Both backends. The step's calls are counted in a file (an effect, not a log line).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from durably import Client
from tests import children

COMMON = """
import durably

@durably.step
def get_order(order_id: str, calls: str) -> {returns}:
    with open(calls, "a") as f:
        f.write(order_id + "\\n")
    return {returns}(id=order_id, total=12.5)

@durably.workflow(name="checkout")
async def checkout(order_id: str, calls: str) -> str:
    order = await get_order(order_id, calls)
    approval = await durably.wait_for_signal("approval")
    return f"{{type(order).__name__}} {{order.id}} {{order.total}} {{order.currency}} {{approval}}"
"""

V1 = """
import pydantic

class Order(pydantic.BaseModel):
    id: str
    total: float

    @property
    def currency(self) -> str:
        return "-"
""" + COMMON.format(returns="Order")

RENAMED = """
import pydantic

class PurchaseOrder(pydantic.BaseModel):
    id: str
    total: float

    @property
    def currency(self) -> str:
        return "-"
""" + COMMON.format(returns="PurchaseOrder")

REQUIRED_FIELD = """
import pydantic

class Order(pydantic.BaseModel):
    id: str
    total: float
    currency: str
""" + COMMON.format(returns="Order")

COMPATIBLE = """
import pydantic

class Order(pydantic.BaseModel):
    id: str
    total: float
    currency: str = "EUR"
""" + COMMON.format(returns="Order")

ALIASED = """
import pydantic

class {name}(pydantic.BaseModel):
    id: str = pydantic.Field(alias="orderId")
    total: float

    @property
    def currency(self) -> str:
        return "-"
""" + COMMON.replace("{returns}(id=order_id", "{returns}(orderId=order_id")

#: Runs in a child process next to one version of app.py: start the workflow and
#: return once it is parked, or approve it and return once it has finished.
DRIVER = """
import asyncio, sys, time
import durably
import app

url, mode, wid, calls = sys.argv[1:5]

async def wait(engine, done, what):
    deadline = time.monotonic() + 60
    while True:
        info = await engine.get_workflow(wid)
        if done(info):
            return info
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}: {info.status}")
        await asyncio.sleep(0.02)

async def main():
    async with durably.Engine(url, poll_interval=0.05) as engine:
        if mode == "start":
            await engine.start(app.checkout, "A1", calls, workflow_id=wid)
            await wait(engine, lambda i: i.status == "waiting", "the approval wait")
        elif mode == "approve":
            await engine.send_signal(wid, "approval", "yes")
            info = await wait(engine, lambda i: i.finished, "the end")
            print("STATUS", info.status)
        else:  # resume
            await engine.resume(wid)
            info = await wait(engine, lambda i: i.finished, "the end")
            print("STATUS", info.status)

asyncio.run(main())
"""


def _deploy(root: Path, version: str) -> Path:
    """A directory holding one version of app.py and the driver, as a deploy would."""
    root.mkdir()
    (root / "app.py").write_text(textwrap.dedent(version))
    (root / "workflow_task.py").write_text(DRIVER)
    return root


def _run(code: Path, url: str, mode: str, calls: Path) -> str:
    proc = subprocess.run(
        children.python(str(code / "workflow_task.py"), url, mode, "wf", str(calls)),
        env=children.child_env(),
        cwd=code,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _parked_by_v1(tmp_path: Path, url: str) -> Path:
    calls = tmp_path / "calls.txt"
    _run(_deploy(tmp_path / "v1", V1), url, "start", calls)
    with Client(url) as client:
        assert client.get_workflow("wf").status == "waiting"
        [receipt] = [e for e in client.history("wf") if e.kind == "step"]
    assert '"class":"app:Order"' in (receipt.payload or "")
    return calls


def test_a_renamed_class_decodes_through_the_annotation(store_url: str, tmp_path: Path) -> None:
    calls = _parked_by_v1(tmp_path, store_url)
    out = _run(_deploy(tmp_path / "v2", RENAMED), store_url, "approve", calls)
    assert "STATUS completed" in out, out
    with Client(store_url) as client:
        info = client.get_workflow("wf")
    assert json.loads(info.output or "null") == "PurchaseOrder A1 12.5 - yes"
    assert calls.read_text().splitlines() == ["A1"]  # the step ran once, under v1


def test_a_new_required_field_diverges_then_resumes_on_compatible_code(
    store_url: str, tmp_path: Path
) -> None:
    calls = _parked_by_v1(tmp_path, store_url)
    out = _run(_deploy(tmp_path / "v2", REQUIRED_FIELD), store_url, "approve", calls)
    assert "STATUS diverged" in out, out
    with Client(store_url) as client:
        info = client.get_workflow("wf")
    error = json.loads(info.error or "{}")
    assert error["type"] == "durably.errors.RecordedValueMismatch"
    message = error["message"]
    for part in (
        "at seq 1",
        "step 'get_order'",
        "stored value: pydantic 'app:Order' {id: str, total: float}",
        "today's type app:Order",
        "currency: Field required",
        "durably resume wf --no-wait",
    ):
        assert part in message, message

    out = _run(_deploy(tmp_path / "v3", COMPATIBLE), store_url, "resume", calls)
    assert "STATUS completed" in out, out
    with Client(store_url) as client:
        info = client.get_workflow("wf")
    assert json.loads(info.output or "null") == "Order A1 12.5 EUR yes"
    assert calls.read_text().splitlines() == ["A1"]  # never run again: its receipt was used


def test_a_model_with_aliased_fields_parks_and_decodes_after_a_rename(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A model whose fields have aliases (``orderId``) is stored by field name: the first
    run gets it back and parks, and a deploy that renamed the class builds it by the
    annotation. Before, both decodes validated the names as aliases and failed."""
    calls = tmp_path / "calls.txt"
    v1 = ALIASED.format(name="Order", returns="Order")
    _run(_deploy(tmp_path / "v1", v1), sqlite_url, "start", calls)
    with Client(sqlite_url) as client:
        assert client.get_workflow("wf").status == "waiting"
    v2 = ALIASED.format(name="PurchaseOrder", returns="PurchaseOrder")
    out = _run(_deploy(tmp_path / "v2", v2), sqlite_url, "approve", calls)
    assert "STATUS completed" in out, out
    with Client(sqlite_url) as client:
        info = client.get_workflow("wf")
    assert json.loads(info.output or "null") == "PurchaseOrder A1 12.5 - yes"
    assert calls.read_text().splitlines() == ["A1"]
