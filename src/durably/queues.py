"""Queues: work that any engine serving the queue runs, within limits that hold
across every worker on every machine.

::

    llm = durably.Queue("llm", concurrency=10, worker_concurrency=3, rate_limit=(50, 60.0))

    handle = await llm.enqueue(engine, summarize, doc_id, deduplication_id=doc_id)
    workflow_id = llm.enqueue_sync(client, summarize, doc_id)   # from a web handler

    async with durably.Engine(url, queues=[llm]) as worker: ...
    # or, from a shell: durably worker MODULE --queue llm

``enqueue`` commits a pending workflow on the queue and returns; it runs on
an engine given the queue (possibly the one that enqueued it, possibly on
another machine), when the queue's limits let it:

* ``concurrency``: at most this many of the queue's workflows run at once,
  counted over every executor (a sleeping or waiting workflow holds no place, nor
  one asked to cancel, even while its plain code still runs);
* ``worker_concurrency``: at most this many at once on one executor;
* ``rate_limit=(limit, per_seconds)``: at most ``limit`` workflows start (are
  first claimed) within any ``per_seconds`` window, measured from the claim
  times in the database: the way to stay inside an LLM API's quota.

Within a queue, higher ``priority`` runs first, then older work. A
``deduplication_id`` makes ``enqueue`` return the workflow of the queue that
already holds it while that one is unfinished, instead of adding a second.

Per enqueue:

* ``delay=seconds``: not started before the delay has passed (counted from
  the enqueue, by the clock of the process that enqueued it);
* ``partition_key=`` on a ``Queue(..., concurrency=n, partition=True)``: at
  most ``n`` run per key (e.g. one per customer), while different keys run
  side by side; ``worker_concurrency`` and ``rate_limit`` still hold for the
  whole queue. A partitioned queue needs a key on every enqueue, and a key on a
  queue that is not partitioned is refused (``QueueOptionError``): a key that
  limits nothing is a mistake to report, not to ignore;
* ``debounce=key`` with ``delay=``: a burst of enqueues with the same key keeps
  only its last one (its arguments), which starts once ``delay`` has passed
  after it. Each earlier one that has not started yet is *superseded*: it ends
  ``cancelled`` in the same transaction, never runs, and awaiting its result
  raises ``durably.errors.Superseded`` (a ``durably.Cancelled``) naming the
  later workflow. One that already started is left alone, so the enqueue after
  it is a run of its own.

A workflow can put a child on a queue: ``durably.start_child(wf, ...,
queue=llm)`` (and ``partition_key=``); the child waits its turn like any
enqueued workflow.

Each executor enforces the limits of the Queue object it was given, so give
every worker the same definition (define it once, in the module the workers
import). Queues are registered by name when defined, which is how ``durably
worker --queue NAME`` finds them.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING, Any

from durably import errors, operations, validate
from durably.storage import base

if TYPE_CHECKING:
    from durably.client import Client
    from durably.engine import Engine, WorkflowHandle

_registry: dict[str, Queue] = {}


class Queue:
    """A named queue of workflows with optional global, per-worker and rate limits."""

    def __init__(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        worker_concurrency: int | None = None,
        rate_limit: tuple[int, float] | None = None,
        priority: int = 0,
        partition: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise errors.DefinitionError("a queue needs a non-empty name")
        validate.name(name, "queue name")
        bad = errors.DefinitionError
        for label, value in (
            ("concurrency", concurrency),
            ("worker_concurrency", worker_concurrency),
        ):
            if value is not None:
                validate.count(value, f"queue {name!r}: {label}", error=bad)
        if rate_limit is not None:
            if not isinstance(rate_limit, tuple) or len(rate_limit) != 2:
                raise bad(f"queue {name!r}: rate_limit is (limit, per_seconds), not {rate_limit!r}")
            validate.count(rate_limit[0], f"queue {name!r}: rate_limit limit", error=bad)
            per = f"queue {name!r}: rate_limit per_seconds"
            validate.number(rate_limit[1], per, above=True, error=bad)
        low, high = validate.BIGINT
        validate.count(priority, f"queue {name!r}: priority", low=low, high=high, error=bad)
        if not isinstance(partition, bool):
            raise bad(f"queue {name!r}: partition is True or False, not {partition!r}")
        if partition and concurrency is None:
            raise bad(f"queue {name!r}: partition=True needs concurrency (the limit per key)")
        self.name = name
        self.concurrency = concurrency
        self.worker_concurrency = worker_concurrency
        self.rate_limit = rate_limit
        self.priority = priority
        self.partition = partition
        _registry[name] = self

    @staticmethod
    def named(name: str) -> Queue | None:
        """The queue defined under ``name`` in this process (the last one defined)."""
        return _registry.get(name)

    @staticmethod
    def defined() -> list[Queue]:
        """Every queue defined in this process, by name."""
        return [_registry[name] for name in sorted(_registry)]

    def __repr__(self) -> str:
        limits = [
            f"{label}={value!r}"
            for label, value in (
                ("concurrency", self.concurrency),
                ("worker_concurrency", self.worker_concurrency),
                ("rate_limit", self.rate_limit),
            )
            if value is not None
        ]
        if self.partition:
            limits.append("partition=True")
        return f"Queue({', '.join([repr(self.name), *limits])})"

    @property
    def limits(self) -> base.QueueLimits:
        """The limits as the store's ``claim_next`` takes them."""
        limit, per = self.rate_limit if self.rate_limit is not None else (None, 1.0)
        return base.QueueLimits(
            self.name, self.concurrency, self.worker_concurrency, limit, float(per), self.partition
        )

    async def enqueue(
        self,
        engine: Engine,
        wf: Any,
        *args: Any,
        workflow_id: str | None = None,
        priority: int | None = None,
        deduplication_id: str | None = None,
        delay: float = 0.0,
        partition_key: str | None = None,
        debounce: str | None = None,
        timeout: float | datetime.timedelta | None = None,
        **kwargs: Any,
    ) -> WorkflowHandle:
        """Commit the workflow on this queue through an open engine; return its handle.

        Committed before this returns. An existing ``workflow_id`` (or, while
        unfinished, ``deduplication_id``) returns the workflow that holds it.
        ``delay``, ``partition_key`` and ``debounce``: see the module docstring.
        ``timeout`` gives it a deadline counted from now, waiting in the queue
        included: past it, it is cancelled (unstarted, it never runs).
        """
        options = _Options(priority, deduplication_id, delay, partition_key, debounce)
        new = self._new(wf, args, kwargs, workflow_id, options, timeout)
        info = await engine.submit(new)
        operations.check_name(info, new.name)
        return engine.handle(info.workflow_id)

    def enqueue_sync(
        self,
        client: Client,
        wf: Any,
        *args: Any,
        workflow_id: str | None = None,
        priority: int | None = None,
        deduplication_id: str | None = None,
        delay: float = 0.0,
        partition_key: str | None = None,
        debounce: str | None = None,
        timeout: float | datetime.timedelta | None = None,
        **kwargs: Any,
    ) -> str:
        """Commit the workflow on this queue through a Client; return its id.

        For code without an event loop (web handlers, scripts). As ``enqueue``.
        """
        options = _Options(priority, deduplication_id, delay, partition_key, debounce)
        new = self._new(wf, args, kwargs, workflow_id, options, timeout)
        info = client.submit(new)
        operations.check_name(info, new.name)
        return info.workflow_id

    def _new(
        self,
        wf: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        workflow_id: str | None,
        options: _Options,
        timeout: float | datetime.timedelta | None = None,
    ) -> base.NewWorkflow:
        priority = options.priority
        if priority is not None:
            low, high = validate.BIGINT
            validate.count(priority, "priority", low=low, high=high)
        if options.deduplication_id is not None:
            validate.name(options.deduplication_id, "deduplication_id")
        delay = validate.number(options.delay, "delay")
        self.check_partition_key(options.partition_key)
        if options.debounce is not None:
            validate.name(options.debounce, "debounce key")
            if delay <= 0:
                raise errors.QueueOptionError(
                    f"queue {self.name!r}: debounce={options.debounce!r} needs a delay > 0 "
                    "(the quiet time after the last enqueue of a burst before it starts)"
                )
        new, _ = operations.new_workflow(wf, args, kwargs, workflow_id, timeout=timeout)
        return dataclasses.replace(
            new,
            queue=self.name,
            priority=self.priority if priority is None else priority,
            deduplication_id=options.deduplication_id,
            delay=delay,
            partition_key=options.partition_key,
            debounce_key=options.debounce,
        )

    def check_partition_key(self, partition_key: str | None) -> None:
        """Raise QueueOptionError unless the key fits: a partitioned queue needs one, and a
        queue that is not partitioned refuses one (InvalidName for a key no database
        stores)."""
        if partition_key is not None:
            validate.name(partition_key, "partition_key")
            if not self.partition:
                raise errors.QueueOptionError(
                    f"queue {self.name!r} is not partitioned: partition_key={partition_key!r} "
                    "would limit nothing (define it with Queue(..., partition=True))"
                )
        elif self.partition:
            raise errors.QueueOptionError(
                f"queue {self.name!r} is partitioned: each enqueue needs a partition_key"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
    """The per-enqueue options of ``enqueue`` and ``enqueue_sync``, as given."""

    priority: int | None
    deduplication_id: str | None
    delay: float
    partition_key: str | None
    debounce: str | None
