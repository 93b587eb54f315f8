"""The threads sync steps run on (durably.step_threads), alone and under an engine.

A step the loop's thread waits for runs on a thread kept on that thread's CPU, and a
longer one is let go to any CPU; the placement is read back from the kernel inside
the step (``os.sched_getaffinity``), not taken from the pool's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import step_threads

_PLACES = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1
needs_cpus = pytest.mark.skipif(
    not _PLACES, reason="placing a thread needs Linux and more than one CPU to choose from"
)


def _cpus() -> set[int]:
    return set(os.sched_getaffinity(0))


def test_a_result_an_error_and_the_arguments_come_back() -> None:
    pool = step_threads.StepThreads(2)
    try:
        assert pool.submit(lambda a, b: a + b, 2, 3).result(5) == 5
        failing = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(5)
        stopping = pool.submit(lambda: (_ for _ in ()).throw(KeyboardInterrupt))
        assert isinstance(stopping.exception(5), KeyboardInterrupt)  # not lost in the thread
    finally:
        pool.shutdown()


def test_one_step_after_another_reuses_one_thread() -> None:
    pool = step_threads.StepThreads(8)
    try:
        names = {pool.submit(lambda: threading.current_thread().name).result(5) for _ in range(50)}
        assert names == {"durably-step_0"}
        assert len(pool.threads()) == 1
    finally:
        pool.shutdown()


def test_no_more_threads_than_its_size_and_the_rest_wait_in_turn() -> None:
    pool = step_threads.StepThreads(3)
    gate = threading.Event()
    running: list[int] = []
    lock = threading.Lock()
    most = [0]

    def step(i: int) -> int:
        with lock:
            running.append(i)
            most[0] = max(most[0], len(running))
        gate.wait(5)
        with lock:
            running.remove(i)
        return i

    try:
        futures = [pool.submit(step, i) for i in range(10)]
        deadline = time.monotonic() + 5
        while len(running) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.02)  # a fourth thread, had one been made, would be running by now
        assert len(pool.threads()) == 3
        assert sorted(running) == [0, 1, 2]  # the others wait, in the order given
        gate.set()
        assert [f.result(5) for f in futures] == list(range(10))
        assert most[0] == 3
    finally:
        gate.set()
        pool.shutdown()


@pytest.mark.parametrize("given", ["submit", "hand", "run"])
def test_a_step_cancelled_before_it_began_is_not_run(given: str) -> None:
    """Given to the one busy thread, then its caller is cancelled: through the future
    ``submit`` returns, the one a held step is let go to, or ``run``'s asyncio one."""
    pool = step_threads.StepThreads(1)
    gate = threading.Event()
    ran: list[str] = []

    async def cancelled_while_waiting() -> None:
        busy = pool.submit(gate.wait, 5)
        step = lambda: ran.append(given)  # noqa: E731
        if given == "submit":
            assert pool.submit(step).cancel()
        elif given == "hand":
            held = pool.hand(step)
            assert not held.wait(0.01)  # the one thread is busy
            assert held.future().cancel()
        else:
            assert pool.run(step).cancel()
        gate.set()
        assert busy.result(5) is True
        assert pool.submit(lambda: "after").result(5) == "after"  # served in turn

    try:
        asyncio.run(cancelled_while_waiting())
        assert ran == []
    finally:
        gate.set()
        pool.shutdown()


def test_shutdown_ends_idle_threads_finishes_the_running_step_and_takes_no_more() -> None:
    pool = step_threads.StepThreads(4)
    gate = threading.Event()
    idle = pool.submit(lambda: "idle")
    idle.result(5)
    busy = pool.submit(gate.wait, 5)
    queued = [pool.submit(lambda i=i: i) for i in range(3)]
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(lambda: None)
    gate.set()
    assert busy.result(5) is True
    assert [f.result(5) for f in queued] == [0, 1, 2]  # taken before the shutdown: run
    deadline = time.monotonic() + 5
    while pool.threads() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.threads() == []


def _woken_on() -> tuple[int, set[int]]:
    """The CPU the step began on and the CPUs it may use then."""
    return _this_cpu(), _cpus()


def _this_cpu() -> int:
    import ctypes

    return int(ctypes.CDLL(None).sched_getcpu())


def test_a_step_taken_just_before_shutdown_runs_although_its_thread_was_finishing() -> None:
    """The thread's last step's callback takes the thread for another step, then shuts
    the pool down: the thread must see the step it was given before it ends."""
    pool = step_threads.StepThreads(1)
    gate = threading.Event()
    taken: list[concurrent.futures.Future[str]] = []

    def then(_: object) -> None:  # runs on the thread, as it hands over its outcome
        taken.append(pool.submit(lambda: "ran"))
        pool.shutdown()

    first = pool.submit(gate.wait, 5)
    first.add_done_callback(then)
    gate.set()
    deadline = time.monotonic() + 5
    while not taken and time.monotonic() < deadline:
        time.sleep(0.001)
    assert taken[0].result(5) == "ran"


def test_a_thread_that_cannot_start_or_read_its_cpus_loses_no_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = step_threads.StepThreads(1)
    with monkeypatch.context() as patched:

        def no_thread(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        patched.setattr(threading.Thread, "start", no_thread)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            pool.submit(int)
    assert pool.submit(lambda: "next").result(5) == "next"  # the failed one left no place taken
    pool.shutdown()

    def refuse(pid: int) -> set[int]:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_getaffinity", refuse, raising=False)
    blind = step_threads.StepThreads(1)
    try:
        assert blind.submit(lambda: "runs", near=True).result(5) == "runs"
    finally:
        blind.shutdown()


def test_a_cpu_reader_that_fails_or_a_callback_that_raises_loses_no_thread() -> None:
    def unreadable() -> int:
        raise ZeroDivisionError("no CPU to read")

    pool = step_threads.StepThreads(1, cpu=unreadable)
    try:
        assert [pool.submit(lambda i=i: i, near=True).result(5) for i in range(3)] == [0, 1, 2]
        gate = threading.Event()
        held = pool.submit(gate.wait, 5)
        held.add_done_callback(lambda _: (_ for _ in ()).throw(KeyboardInterrupt))
        gate.set()  # the callback raises on the thread, as it hands over the outcome
        assert held.result(5) is True
        assert pool.submit(lambda: "after").result(5) == "after"  # the one thread lives on
        assert len(pool.threads()) == 1
    finally:
        pool.shutdown()


@needs_cpus
@pytest.mark.parametrize("given", ["submit", "hand"])
def test_a_step_waited_for_is_woken_on_the_callers_cpu_and_runs_free_of_it(given: str) -> None:
    home = _cpus()
    first, last = min(home), max(home)
    where = [first]
    pool = step_threads.StepThreads(2, cpu=lambda: where[0])  # "the caller is on" where[0]

    def began() -> tuple[int, set[int]]:
        if given == "submit":
            return pool.submit(_woken_on, near=True).result(5)
        held = pool.hand(_woken_on)
        assert held.wait(5)
        return held.result()  # type: ignore[no-any-return]

    try:
        for cpu in (first, last, first):
            where[0] = cpu
            steps = [began() for _ in range(20)]
            # woken there (a thread free to run anywhere could not follow each move),
            on_it = sum(1 for on, _ in steps if on == cpu)
            assert on_it >= 15, f"{on_it} of 20 steps began on CPU {cpu}: {steps}"
            # and free of it before the step's own code ran
            assert all(cpus == home for _, cpus in steps)
        # not waited for: woken wherever the system puts it
        assert pool.submit(_cpus).result(5) == home
    finally:
        pool.shutdown()


@needs_cpus
def test_a_thread_or_process_a_step_starts_may_use_every_cpu() -> None:
    home = _cpus()
    pool = step_threads.StepThreads(1)

    def starts_both() -> tuple[set[int], str]:
        seen: list[set[int]] = []
        thread = threading.Thread(target=lambda: seen.append(_cpus()))
        thread.start()
        thread.join(5)
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return seen[0], child.stdout.strip()

    try:
        in_thread, in_child = pool.submit(starts_both, near=True).result(30)
        assert in_thread == home
        assert in_child == str(sorted(home))
    finally:
        pool.shutdown()


@needs_cpus
def test_a_system_that_refuses_to_place_threads_leaves_them_where_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(pid: int, cpus: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)  # the OS refuses (a sandbox)
    pool = step_threads.StepThreads(1)
    try:
        assert [pool.submit(_cpus, near=True).result(5) for _ in range(3)] == [_cpus()] * 3
    finally:
        pool.shutdown()


@durably.step
def where_it_runs(hold: float) -> dict[str, Any]:
    began = {"thread": threading.current_thread().name, "cpus": sorted(_cpus())}
    time.sleep(hold)
    return began


@durably.workflow
async def placed_steps() -> list[dict[str, Any]]:
    quick = [await where_it_runs(0.0) for _ in range(5)]
    slow = await where_it_runs(0.05)  # longer than the loop's thread waits for it
    both = await asyncio.gather(where_it_runs(0.02), where_it_runs(0.02))
    return [*quick, slow, *both]


@needs_cpus
async def test_an_engines_sync_steps_run_free_of_the_cpu_their_thread_was_woken_on(
    tmp_path: Path,
) -> None:
    home = sorted(_cpus())
    async with durably.Engine(f"sqlite:///{tmp_path}/placed.db") as engine:
        handle = await engine.start(placed_steps)
        *quick, slow, a, b = await handle.result()
    assert all(step["thread"].startswith("durably-step") for step in [*quick, slow, a, b])
    assert all(step["cpus"] == home for step in [*quick, slow, a, b])
    assert a["thread"] != b["thread"]  # two at once: two threads


@durably.step
def add_on_a_thread(a: int, b: int) -> int:
    return a + b


@durably.workflow
async def many_sync_steps(n: int) -> int:
    total = 0
    for i in range(n):
        total = await add_on_a_thread(total, i)
    return total


async def test_sync_steps_of_many_workflows_at_once_all_commit(tmp_path: Path) -> None:
    async with durably.Engine(f"sqlite:///{tmp_path}/many.db", step_threads=4) as engine:
        handles = [await engine.start(many_sync_steps, 20) for _ in range(30)]
        results = await asyncio.gather(*(h.result() for h in handles))
        assert results == [sum(range(20))] * 30
        assert len(engine._step_threads.threads()) <= 4  # a test of the bound: its own pool
        for h in handles[:3]:
            steps = [e for e in await engine.history(h.workflow_id) if e.kind == "step"]
            assert len(steps) == 20 and all(e.status == "completed" for e in steps)


def test_futures_are_concurrent_futures() -> None:
    """What asyncio.wrap_future and the hold's wait take."""
    pool = step_threads.StepThreads(1)
    try:
        future = pool.submit(lambda: 7)
        assert isinstance(future, concurrent.futures.Future)
        assert asyncio.run(_wrapped(future)) == 7
    finally:
        pool.shutdown()


async def _wrapped(future: concurrent.futures.Future[int]) -> int:
    return await asyncio.wrap_future(future)


def test_a_handed_step_comes_back_to_its_holder_with_its_result_or_error() -> None:
    pool = step_threads.StepThreads(2)
    try:
        added = pool.hand(lambda a, b: a + b, 2, 3)
        assert added.wait(5)
        assert added.result() == 5
        failing = pool.hand(lambda: 1 / 0)
        assert failing.wait(5)
        with pytest.raises(ZeroDivisionError):
            failing.result()
        stopping = pool.hand(lambda: (_ for _ in ()).throw(KeyboardInterrupt))
        assert stopping.wait(5)
        with pytest.raises(KeyboardInterrupt):  # not lost in the thread
            stopping.result()
        names = set()
        for _ in range(30):
            named = pool.hand(lambda: threading.current_thread().name)
            assert named.wait(5)
            names.add(named.result())
        assert names == {"durably-step_0"}  # one after another: one thread
    finally:
        pool.shutdown()


def test_a_handed_step_that_outlasts_the_hold_is_delivered_to_its_future() -> None:
    pool = step_threads.StepThreads(1)
    gate, began = threading.Event(), threading.Event()

    def slow_step() -> str:
        began.set()
        gate.wait(5)
        return "slow"

    try:
        slow = pool.hand(slow_step)
        assert began.wait(5)
        assert not slow.wait(0.01)  # the holder stops holding
        future = slow.future()
        assert not future.cancel()  # it runs already: too late to cancel
        with pytest.raises(RuntimeError, match="twice"):
            slow.future()
        gate.set()
        assert future.result(5) == "slow"
        assert asyncio.run(_wrapped(pool.hand(lambda: 8).future())) == 8
    finally:
        gate.set()
        pool.shutdown()


def test_a_handed_step_that_finished_as_the_hold_ended_is_not_lost() -> None:
    """The step's thread delivers between the holder's last wait and its asking for a
    future: the future it gets is done already, with the outcome."""
    pool = step_threads.StepThreads(1)
    try:
        quick = pool.hand(lambda: "quick")
        pool.submit(int).result(5)  # its one thread delivered the first before the next
        future = quick.future()  # without a wait that saw it
        assert future.done() and future.result() == "quick"
        failing = pool.hand(lambda: 1 / 0)
        pool.submit(int).result(5)
        assert isinstance(failing.future().exception(0), ZeroDivisionError)
    finally:
        pool.shutdown()


async def test_a_step_run_for_a_loop_comes_back_to_its_future() -> None:
    pool = step_threads.StepThreads(2)
    try:
        assert await pool.run(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 / 0)
        assert await asyncio.gather(*(pool.run(lambda i=i: i * i) for i in range(20))) == [
            i * i for i in range(20)
        ]
    finally:
        pool.shutdown()


async def test_steps_that_finish_together_wake_their_loop_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    wakes: list[object] = []
    real = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
        wakes.append(callback)
        return real(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)  # this loop only
    pool = step_threads.StepThreads(8)
    gate = threading.Event()
    done = []
    try:

        def step(i: int) -> int:
            gate.wait(5)
            done.append(i)
            return i

        futures = [pool.run(step, i) for i in range(8)]
        gate.set()
        deadline = time.monotonic() + 5
        posted = pool._mailbox._items  # type: ignore[union-attr]  # (a test of the mailbox)
        while len(posted) < 8 and time.monotonic() < deadline:
            time.sleep(0.001)  # the loop's thread busy: no wake-up is handled meanwhile
        assert sorted(done) == list(range(8))
        assert sorted(await asyncio.gather(*futures)) == list(range(8))
        assert len(wakes) == 1, wakes
    finally:
        gate.set()
        pool.shutdown()


def test_a_step_whose_loop_closed_meanwhile_leaves_its_thread_serving() -> None:
    pool = step_threads.StepThreads(1)
    gate = threading.Event()
    try:

        async def start() -> asyncio.Future[Any]:
            return pool.run(gate.wait, 5)

        loop = asyncio.new_event_loop()
        pending = loop.run_until_complete(start())
        loop.close()  # the step still runs; its outcome has no loop to go to
        gate.set()
        posted = pool._mailbox._items  # type: ignore[union-attr]  # (a test of the mailbox)
        deadline = time.monotonic() + 5
        while not posted and time.monotonic() < deadline:
            time.sleep(0.001)
        assert posted and not pending.done()  # posted to a loop that is gone: nothing raised
        assert asyncio.run(_awaited(pool, lambda: "next loop")) == "next loop"
        assert len(pool.threads()) == 1
    finally:
        gate.set()
        pool.shutdown()


async def _awaited(pool: step_threads.StepThreads, fn: Any) -> Any:
    return await asyncio.wait_for(pool.run(fn), 5)


def _stops() -> None:
    raise StopIteration("done")


def _stops_later() -> None:
    time.sleep(0.05)  # longer than the loop's thread holds for it
    raise StopIteration("done")


async def test_a_sync_step_raising_stopiteration_fails_instead_of_hanging() -> None:
    """A future refuses a StopIteration: the caller would wait for ever."""
    pool = step_threads.StepThreads(2)
    try:
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(pool.run(_stops), 5)
        held = pool.hand(_stops)
        assert held.wait(5)
        with pytest.raises(RuntimeError, match="StopIteration"):
            held.result()
        slow = pool.hand(_stops_later)
        assert not slow.wait(0.001)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(asyncio.wrap_future(slow.future()), 5)
    finally:
        pool.shutdown()


@durably.step
def stops_at_once() -> None:
    raise StopIteration("no more")


@durably.workflow
async def stops_in_a_gather() -> str:
    try:
        # the first is given to a thread while the second waits to start (the loop is
        # not quiet: no hold), the second is held for (the loop is quiet by then)
        await asyncio.gather(stops_at_once(), stops_at_once())
    except RuntimeError as exc:
        return f"failed: {exc}"
    return "no error"


async def test_a_workflows_sync_step_raising_stopiteration_fails_the_step(
    tmp_path: Path,
) -> None:
    async with durably.Engine(f"sqlite:///{tmp_path}/stops.db") as engine:
        handle = await engine.start(stops_in_a_gather)
        assert "StopIteration" in await handle.result(timeout=10)


async def test_a_handed_step_let_go_comes_back_to_its_loop() -> None:
    pool = step_threads.StepThreads(2)
    gate = threading.Event()
    try:
        slow = pool.hand(lambda: gate.wait(5) and "slow")
        assert not slow.wait(0.001)
        later = pool.let_go(slow)
        with pytest.raises(RuntimeError, match="twice"):
            pool.let_go(slow)
        gate.set()
        assert await asyncio.wait_for(later, 5) == "slow"
        failing = pool.hand(_fails_later)
        assert not failing.wait(0.001)
        with pytest.raises(ZeroDivisionError):
            await asyncio.wait_for(pool.let_go(failing), 5)
    finally:
        gate.set()
        pool.shutdown()
    one = step_threads.StepThreads(1)
    try:
        quick = one.hand(lambda: "quick")
        one.submit(int).result(5)  # its one thread delivered the first before the next
        assert await asyncio.wait_for(one.let_go(quick), 5) == "quick"  # here already
    finally:
        one.shutdown()


def _fails_later() -> None:
    time.sleep(0.02)
    raise ZeroDivisionError("later")


def _cancelled_error() -> None:
    raise concurrent.futures.CancelledError("the step's own")


async def test_a_sync_step_raising_a_cancelled_error_fails_it_on_every_path() -> None:
    """concurrent.futures.CancelledError is an Exception a step raises, not a cancel of its
    caller: the same whether the caller held for it, let it go or never held."""
    pool = step_threads.StepThreads(2)
    try:
        with pytest.raises(concurrent.futures.CancelledError, match="own"):
            await asyncio.wait_for(pool.run(_cancelled_error), 5)
        held = pool.hand(_cancelled_error)
        assert held.wait(5)
        with pytest.raises(concurrent.futures.CancelledError, match="own"):
            held.result()

        def later() -> None:
            time.sleep(0.02)
            _cancelled_error()

        slow = pool.hand(later)
        assert not slow.wait(0.001)
        with pytest.raises(concurrent.futures.CancelledError, match="own"):
            await asyncio.wait_for(pool.let_go(slow), 5)
        assert not asyncio.current_task().cancelled()  # type: ignore[union-attr]
    finally:
        pool.shutdown()
