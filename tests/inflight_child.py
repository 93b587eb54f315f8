"""A child process that runs many chained workflows at once, to be SIGKILLed mid-run.

    python -m tests.inflight_child --url URL --effects PATH
        [--workflows N] [--steps K] [--no-inline] [--lease-seconds S]

Opens ``durably.Engine(URL)`` (which takes over the work of a killed process) and
starts, or attaches to, the workflows ``chain-0`` .. ``chain-{N-1}`` all at once:
with that many in flight the event loop is busy, so their commits are gathered
(SQLite) or grouped by a store thread (PostgreSQL, or ``--no-inline``). Each
workflow is a chain of K steps (async ones for even workflows; plain ``def`` ones,
on the engine's step threads, for odd ones), each step given the token its
predecessor returned: it appends one JSON line (workflow, index, the token it was
given, the new token it returns, pid) to the effects file, works half a
millisecond, and returns the new token. A step that ran on a result later lost
would show up as a line whose ``prev`` is not the token the journal holds.

Prints one JSON line: each workflow's list of tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

import durably

EFFECTS_ENV = "INFLIGHT_EFFECTS"
WORK_SECONDS = 0.0005


def _link(w: int, k: int, prev: str) -> str:
    """One link of the chain: its effect is a line in the effects file."""
    token = uuid.uuid4().hex
    line = json.dumps({"w": w, "k": k, "prev": prev, "token": token, "pid": os.getpid()})
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    # Some work after the effect (parsing a reply, say): the workflows a batch answered
    # run their next step's effect before the next batch commits, so a kill finds
    # effects that followed a result not yet durable, if there is one.
    until = time.perf_counter() + WORK_SECONDS
    while time.perf_counter() < until:
        pass
    return token


@durably.step(name="link")
async def link(w: int, k: int, prev: str) -> str:
    """A link as an async step, run on the event loop's thread."""
    return _link(w, k, prev)


@durably.step(name="link_sync")
def link_sync(w: int, k: int, prev: str) -> str:
    """A link as a plain ``def`` step, run on one of the engine's step threads."""
    return _link(w, k, prev)


@durably.workflow(name="chain")
async def chain(w: int, steps: int) -> list[str]:
    """The chain of workflow ``w``: async links for even ``w``, ``def`` links for odd."""
    step = link_sync if w % 2 else link
    tokens: list[str] = []
    prev = ""
    for k in range(steps):
        prev = await step(w, k, prev)
        tokens.append(prev)
    return tokens


async def main(ns: argparse.Namespace) -> None:
    os.environ[EFFECTS_ENV] = ns.effects
    engine = durably.Engine(ns.url, lease_seconds=ns.lease_seconds, inline_commits=not ns.no_inline)
    async with engine:
        handles = [
            await engine.start(chain, w, ns.steps, workflow_id=f"chain-{w}")
            for w in range(ns.workflows)
        ]
        results = await asyncio.gather(*(h.result() for h in handles))
    print(json.dumps({f"chain-{w}": r for w, r in enumerate(results)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--workflows", type=int, default=40)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-inline", action="store_true")
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    asyncio.run(main(parser.parse_args()))
    sys.stdout.flush()
