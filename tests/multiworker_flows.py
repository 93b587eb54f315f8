"""The workflows and queues of the multi-worker tests, imported by every worker process.

Workers are real ``durably worker tests.multiworker_flows`` processes. Every
step appends one JSON line to the file named by ``MW_EFFECTS`` *before* it
acts (flushed and fsynced: a SIGKILL cannot lose it), then calls the fake
payments service at ``MW_PAYMENTS`` with the step's idempotency key, so a test
counts what really ran and what the outside world really saw.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import durably
from durably.queues import Queue
from durably.testing import payments

EFFECTS = "MW_EFFECTS"
PAYMENTS = "MW_PAYMENTS"
STEP_SECONDS = "MW_STEP_SECONDS"  # extra seconds each plain step takes (default 0)

#: The fake payments service is one small threaded HTTP server shared by every worker:
#: under a burst it may reset a connection, which a real client retries too.
RETRY = durably.Retry(max_attempts=10, initial=0.05, max_delay=0.5)

#: Global concurrency 3, whatever the number of workers; one at a time per worker, so that
#: with four workers it is the global limit that holds the fourth back.
LLM = Queue("mw-llm", concurrency=3, worker_concurrency=1)
#: At most 4 starts in any 2 seconds.
RATED = Queue("mw-rated", rate_limit=(4, 2.0))


def record(label: str, **extra: Any) -> dict[str, Any]:
    """Append this step invocation to the effects file; return the line."""
    info = durably.step_info()
    line = {
        "wf": info.workflow_id,
        "seq": info.seq,
        "step": label,
        "attempt": info.attempt,
        "key": info.idempotency_key,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    with open(os.environ[EFFECTS], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return line


def pay(order: str, cents: int) -> str:
    """One keyed effect on the payments service; the refund's id."""
    made = payments.refund(
        os.environ[PAYMENTS], order, cents, idempotency_key=durably.idempotency_key()
    )
    return str(made["refund_id"])


@durably.step(retry=RETRY)
def charge(n: int, k: int) -> int:
    record("charge")
    time.sleep(float(os.environ.get(STEP_SECONDS, "0")))
    pay(f"order-{n}-{k}", 100 * n + k)
    return n + k


@durably.workflow(name="mw.five_steps")
async def five_steps(n: int) -> int:
    total = 0
    for k in range(1, 6):
        total += await charge(n, k)
    return total


def five_steps_expected(n: int) -> int:
    return sum(n + k for k in range(1, 6))


# --- the zombie: a slow middle step --------------------------------------------------------


@durably.step(retry=RETRY)
def quick(label: str) -> str:
    record(label)
    pay(f"zombie-{label}", 1)
    return label


@durably.step
async def stuck(seconds: float) -> str:
    """An async step that blocks its event loop: the worker cannot even heartbeat.

    Stopped (SIGSTOP) in the middle, its worker is a zombie: alive, silent, and
    still about to commit this step's receipt when it is woken.
    """
    record("stuck-start")
    time.sleep(seconds)  # blocks the loop, as CPU-bound code in an async step would
    record("stuck-end")
    pay("zombie-stuck", 2)
    return f"slept {seconds}"


@durably.workflow(name="mw.zombie")
async def zombie(seconds: float) -> list[str]:
    return [await quick("first"), await stuck(seconds), await quick("last")]


# --- queues ------------------------------------------------------------------------------------


@durably.step(retry=RETRY)
def call_llm(n: int) -> str:
    record("llm")
    return pay(f"llm-{n}", n)


@durably.workflow(name="mw.llm_call")
async def llm_call(n: int) -> str:
    return await call_llm(n)


# --- a signal crossing processes -----------------------------------------------------------------


@durably.step
def woke(payload: Any) -> float:
    return float(record("woke", payload=payload)["t"])


@durably.workflow(name="mw.wait_for_go")
async def wait_for_go() -> float:
    payload = await durably.wait_for_signal("go")
    return await woke(payload)
