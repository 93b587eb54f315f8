"""The workflows the crash tests run, in a child process or in the test process.

Every step appends one JSON line per invocation to the effects file named by
``CRASHKIT_EFFECTS`` (append mode, flushed and fsynced before the step goes on),
so a test counts what really ran instead of trusting logs. A line holds the
workflow id, seq, step name, attempt and idempotency key (from
``durably.step_info()``), the step's arguments, the pid and the wall time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from typing import Any

import durably
from durably.context import StepContext

EFFECTS_ENV = "CRASHKIT_EFFECTS"


def record(*args: Any) -> StepContext:
    """Append this invocation to the effects file; return the step's context."""
    info = durably.step_info()
    line = {
        "wf": info.workflow_id,
        "seq": info.seq,
        "step": info.name,
        "attempt": info.attempt,
        "key": info.idempotency_key,
        "args": list(args),
        "pid": os.getpid(),
        "t": time.time(),
    }
    path = os.environ[EFFECTS_ENV]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return info


# --- a linear workflow of four steps (sync and async) ----------------------------------


@durably.step
def step_a(x: int) -> int:
    record(x)
    return x + 1


@durably.step
async def step_b(x: int) -> int:
    record(x)
    return x * 2


@durably.step
def step_c(x: int) -> int:
    record(x)
    return x + 3


@durably.step
async def step_d(x: int) -> int:
    record(x)
    return x * 10


def linear_expected(x: int) -> list[int]:
    """What ``linear(x)`` returns."""
    a = x + 1
    b = a * 2
    c = b + 3
    return [a, b, c, c * 10]


@durably.workflow
async def linear(x: int) -> list[int]:
    a = await step_a(x)
    b = await step_b(a)
    c = await step_c(b)
    d = await step_d(c)
    return [a, b, c, d]


@durably.workflow
async def other(x: int) -> int:
    """A second workflow, to collide with ``linear`` on a workflow id."""
    return await step_a(x)


# --- a step that fails its first attempt and is retried after a durable back-off -------

BACKOFF = 1.0


@durably.step(retry=durably.Retry(max_attempts=3, initial=BACKOFF, jitter=0.0))
def flaky_once(x: int) -> int:
    info = record(x)
    if info.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return x + 100


@durably.workflow
async def with_backoff(x: int) -> list[int]:
    a = await step_a(x)
    f = await flaky_once(a)
    d = await step_d(f)
    return [a, f, d]


# --- a step that is killed from outside while it sleeps ---------------------------------


@durably.step
def sleeper(marker: str) -> str:
    record(marker)
    if not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            os.fsync(fh.fileno())
        time.sleep(60)  # the test SIGKILLs the process long before this ends
    return "woke"


@durably.workflow
async def sleepy(x: int, marker: str) -> list[Any]:
    a = await step_a(x)
    s = await sleeper(marker)
    d = await step_d(a)
    return [a, s, d]


# --- a step that always kills its own executor -----------------------------------------


@durably.step
def kill_self(x: int) -> int:
    record(x)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)  # never reached: SIGKILL cannot be caught
    return x


@durably.workflow
async def crashes_executor(x: int) -> int:
    a = await step_a(x)
    return await kill_self(a)


@durably.workflow(max_recoveries=1)  # its own limit, below the engine's
async def crashes_executor_limited(x: int) -> int:
    a = await step_a(x)
    return await kill_self(a)


# --- steps called in an order read from a file (the test rewrites it) -------------------


def _named_step(name: str) -> Any:
    def body(tag: str) -> str:
        record(tag)
        return f"{name}:{tag}"

    body.__qualname__ = body.__name__ = name
    return durably.step(name=name)(body)


alpha = _named_step("alpha")
beta = _named_step("beta")
gamma = _named_step("gamma")
ORDERED_STEPS = {"alpha": alpha, "beta": beta, "gamma": gamma}


@durably.workflow
async def ordered(order_path: str, catch: bool = False) -> list[str]:
    """Call the steps named in the JSON list at ``order_path``, in that order.

    Reading the file makes the workflow deliberately non-deterministic. With
    ``catch``, every step call swallows NonDeterminismError and the workflow
    returns normally.
    """
    with open(order_path, encoding="utf-8") as fh:
        order = json.load(fh)
    out = []
    for name in order:
        if not catch:
            out.append(await ORDERED_STEPS[name](name))
            continue
        try:
            out.append(await ORDERED_STEPS[name](name))
        except durably.NonDeterminismError as exc:
            out.append(f"caught: {exc}")
    return out


# --- steps whose results cannot be stored ----------------------------------------------


@durably.step
def returns_socket() -> Any:
    record()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.close()  # closed, so the test process never warns about it; still unencodable
    return sock


@durably.step
def returns_lambda() -> Any:
    record()
    return lambda: None


@durably.workflow
async def unencodable(kind: str) -> Any:
    a = await step_a(1)
    b = await (returns_socket() if kind == "socket" else returns_lambda())
    return [a, b]


# --- the generic shape interpreter of the property test ---------------------------------

MODULUS = 1_000_003


def mix(acc: int, p: int) -> int:
    """The deterministic function every shape step computes."""
    return (acc * 31 + p) % MODULUS


@durably.step
def det(index: int, acc: int, p: int, observed: list[Any]) -> int:
    record(index, acc, p, observed)
    return mix(acc, p)


@durably.step(retry=durably.Retry(max_attempts=4, initial=0.05, backoff=1.0, jitter=0.0))
def flaky_det(index: int, acc: int, p: int, k: int, observed: list[Any]) -> int:
    info = record(index, acc, p, k, observed)
    if info.attempt <= k:
        raise RuntimeError(f"planned failure {info.attempt} of {k}")
    return mix(acc, p)


def _call(index: int, acc: int, item: dict[str, Any], observed: list[Any]) -> Any:
    if item.get("k", 0):
        return flaky_det(index, acc, item["p"], item["k"], observed)
    return det(index, acc, item["p"], observed)


@durably.workflow
async def shape(ops: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """Interpret a list of ops (see tests/test_property_crashes.py)."""
    acc = seed
    values: list[Any] = []
    outputs: list[int] = []
    for index, op in enumerate(ops):
        kind = op["op"]
        if kind == "step":
            acc = await _call(index, acc, op, list(values))
        elif kind == "now":
            values.append(durably.now().isoformat())
        elif kind == "random":
            values.append(durably.random())
        elif kind == "uuid4":
            values.append(str(durably.uuid4()))
        elif kind == "gather":
            calls = [_call(index, acc, item, list(values)) for item in op["items"]]
            results = await asyncio.gather(*calls)
            acc = sum(results) % MODULUS
        else:
            raise ValueError(f"unknown op {kind!r}")
        outputs.append(acc)
    return {"acc": acc, "outputs": outputs, "values": values}


# --- branches of an asyncio.gather, each of several steps ----------------------------------


@durably.step
async def api(op: str, name: str, delay: float, kill_marker: str = "") -> str:
    """One call of an outside service: waits ``delay``, then counts itself. Given a
    ``kill_marker`` that does not exist yet, creates it and kills its executor instead."""
    await asyncio.sleep(delay)
    if kill_marker and not os.path.exists(kill_marker):
        open(kill_marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    record(op, name)
    return f"{op}:{name}"


async def _branch(name: str, fetch_delay: float, charge_delay: float, marker: str) -> list[str]:
    fetched = await api("fetch", name, fetch_delay)
    charged = await api("charge", name, charge_delay, marker)
    return [fetched, charged]


@durably.workflow
async def gathered(kill_marker: str) -> list[list[str]]:
    """Two branches of two steps: ``b``'s fetch ends first, so its charge takes seq 3
    and ``a``'s takes seq 4, which the first run is killed in (after ``b``'s charge)."""
    return list(
        await asyncio.gather(_branch("a", 0.3, 0.0, kill_marker), _branch("b", 0.0, 0.1, ""))
    )


async def _sent(name: str, kill_marker: str) -> str:
    """A send's body: counts itself; in the first run (no ``kill_marker`` yet) it then
    waits until its sibling's send has counted itself too, and kills its executor: both
    were on their way to the outside world, and neither has a receipt."""
    record("send", name)
    while not os.path.exists(kill_marker):
        if len(read_lines(os.environ[EFFECTS_ENV])) >= 2:
            open(kill_marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(0.01)
    return f"sent:{name}"


@durably.step
async def send(name: str, kill_marker: str) -> str:
    """``_sent`` as a step."""
    return await _sent(name, kill_marker)


@durably.step
async def send_via(client: object, name: str, kill_marker: str) -> str:
    """``send``, through a client that cannot be encoded (its arguments have no digest)."""
    return await _sent(name, kill_marker)


def read_lines(path: str) -> list[str]:
    """The lines of a file that may not exist yet."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


async def _send_after(name: str, late: bool, kill_marker: str, via_client: bool) -> str:
    await asyncio.sleep(0.2 if late else 0.0)  # not durable: timing, as an API's would be
    if via_client:
        return await send_via(threading.Lock(), name, kill_marker)
    return await send(name, kill_marker)


async def _sends_on_their_way(kill_marker: str, via_client: bool) -> list[str]:
    recovering = os.path.exists(kill_marker)
    return list(
        await asyncio.gather(
            _send_after("a", recovering, kill_marker, via_client),
            _send_after("b", not recovering, kill_marker, via_client),
        )
    )


@durably.workflow
async def both_on_their_way(kill_marker: str) -> list[str]:
    """Two branches whose sends were both on their way at a SIGKILL. The recovery calls
    them in the other order (``a`` was first, ``b`` is), as a slower network might."""
    return await _sends_on_their_way(kill_marker, via_client=False)


@durably.workflow
async def both_on_their_way_through_a_client(kill_marker: str) -> list[str]:
    """``both_on_their_way``, each send given a client that cannot be encoded."""
    return await _sends_on_their_way(kill_marker, via_client=True)


@durably.step
async def notify(name: str, kill_marker: str) -> str:
    """Counts itself. In the first run (no ``kill_marker`` yet) the first call returns
    (its receipt is journaled); the second waits for that, then kills its executor."""
    count = len(read_lines(os.environ[EFFECTS_ENV]))
    record("notify", name)
    if not os.path.exists(kill_marker) and count > 0:
        await asyncio.sleep(0.5)
        open(kill_marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return f"notified:{name}"


@durably.workflow
async def twins_one_done(kill_marker: str) -> list[str]:
    """Two identical calls (the same step, the same arguments) from two branches: told
    apart only by which is which, one journaled before the kill, one not."""

    async def branch() -> str:
        await asyncio.sleep(0)  # the call is the branch's own (a bare call is the workflow's)
        return await notify("x", kill_marker)

    return list(await asyncio.gather(branch(), branch()))


@durably.step
async def quick(name: str) -> str:
    """Returns at once, counting nothing."""
    return name


@durably.workflow
async def twins_of_the_workflow_and_a_branch(kill_marker: str) -> list[str]:
    """The workflow function and a task it started make the same call after the same
    one (none): the workflow's journaled before the kill, the branch's on its way. A
    third task's quick step makes the journal one of tasks run at once."""

    async def branch() -> str:
        return await notify("x", kill_marker)

    async def other() -> str:
        return await quick("q")

    tasks = [asyncio.create_task(branch()), asyncio.create_task(other())]
    own = await notify("x", kill_marker)  # the workflow's call takes its seq first
    return [own, *await asyncio.gather(*tasks)]


@durably.step
async def tick(name: str) -> str:
    """Returns its name."""
    return name


@durably.workflow(name="branches-then-own")
async def branches_then_own() -> list[str]:
    """Two branches' steps, then one of the workflow function's own."""

    async def one(name: str) -> str:
        return await tick(name)

    return [*await asyncio.gather(one("a"), one("b")), await tick("c")]


# --- the branches of the property test of tasks run at once ---------------------------------


@durably.step
async def branch_step(branch: int, index: int, acc: int, p: int, delay: float, seen: str) -> int:
    """Waits ``delay`` (so branches interleave differently in every run), then counts
    itself; ``seen``: the ``durably.now()`` its branch read before it, if any."""
    await asyncio.sleep(delay)
    record(branch, index, acc, p, seen)
    return mix(acc, p)


async def _run_branch(branch: int, items: list[dict[str, Any]], seed: int) -> list[Any]:
    acc, seen = seed + branch, ""
    for index, item in enumerate(items):
        if item.get("now"):
            seen = durably.now().isoformat()
        acc = await branch_step(branch, index, acc, item["p"], item["delay"], seen)
    return [acc, seen]


@durably.workflow
async def branches(spec: list[list[dict[str, Any]]], seed: int) -> list[list[Any]]:
    """An ``asyncio.gather`` of one task per list of ``spec`` (see
    tests/test_property_crashes.py), each a chain of steps."""
    runs = [_run_branch(branch, items, seed) for branch, items in enumerate(spec)]
    return list(await asyncio.gather(*runs))


# --- compensations registered in branches of a gather ---------------------------------------


@durably.step
async def undo(name: str, kill_marker: str = "") -> str:
    """A compensation; given a ``kill_marker`` that does not exist yet, creates it and
    kills its executor before it counts itself."""
    if kill_marker and not os.path.exists(kill_marker):
        open(kill_marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    record("undo", name)
    return f"undo:{name}"


def _second_undo(name: str, kill_marker: str) -> str:
    """A compensation's body; in the first run (no ``kill_marker`` yet) the second one to
    run kills its executor before it counts itself: the first has its receipt."""
    undone = [line for line in read_lines(os.environ[EFFECTS_ENV]) if '"undo"' in line]
    if undone and not os.path.exists(kill_marker):
        open(kill_marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    record("undo", name)
    return f"undo:{name}"


@durably.step
async def second_undo_dies(name: str, kill_marker: str) -> str:
    """``_second_undo`` as a step."""
    return _second_undo(name, kill_marker)


@durably.step
async def second_undo_via(client: object, name: str, kill_marker: str) -> str:
    """``second_undo_dies``, through a client that cannot be encoded."""
    return _second_undo(name, kill_marker)


async def _undo_first(name: str, late: bool, marker: str, via_client: bool) -> str:
    await asyncio.sleep(0.2 if late else 0.0)  # not durable: timing, as an API's would be
    if via_client:  # before the branch's first call
        durably.compensate(second_undo_via, threading.Lock(), name, marker)
    else:
        durably.compensate(second_undo_dies, name, marker)
    return await api("book", name, 0.0)


async def _undos_before_calls(kill_marker: str, via_client: bool) -> None:
    recovering = os.path.exists(kill_marker)
    await asyncio.gather(
        _undo_first("a", recovering, kill_marker, via_client),
        _undo_first("b", not recovering, kill_marker, via_client),
    )
    raise RuntimeError("failed after booking")


@durably.workflow
async def compensated_before_calls(kill_marker: str) -> None:
    """Two branches each register an undo before their first durable call (``a`` first
    in the first run, ``b`` first in the recovery), then the workflow fails."""
    await _undos_before_calls(kill_marker, via_client=False)


@durably.workflow
async def compensated_through_a_client(kill_marker: str) -> None:
    """``compensated_before_calls``, each undo given a client that cannot be encoded."""
    await _undos_before_calls(kill_marker, via_client=True)


async def _booked(name: str, delay: float, marker: str) -> str:
    booked = await api("book", name, delay)
    durably.compensate(undo, name, marker)
    return booked


@durably.workflow
async def compensated_branches(kill_marker: str) -> None:
    """Two branches each book and register an undo (``b``'s ends first), then the
    workflow fails: the second undo run is killed in the first run."""
    await asyncio.gather(_booked("a", 0.3, ""), _booked("b", 0.0, kill_marker))
    raise RuntimeError("failed after booking")
