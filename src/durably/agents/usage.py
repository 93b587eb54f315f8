"""Token usage and cost of model calls, split into billed and replayed.

Every model call is a step whose journaled response carries its usage. A call
is *billed* when its step body ran in this run (the provider was asked and
charged for it); it is *replayed* when the step returned its journaled response
instead, as it does for every call made before a crash. The split is what
``Usage.summary()`` reports: what a recovery would have cost without durably.

Prices are per million tokens and entirely the user's: ``DEFAULT_PRICES`` holds a
few OpenAI list prices as EXAMPLES only. Pass your own table (``price_table=``)
for real accounting.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from durably import codec, context, journal

MODEL_STEP_PREFIX = "llm:"


@dataclasses.dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens: prompt, completion, cached and cache-written prompt tokens.

    ``cached_input`` (tokens read from the prompt cache) and ``cache_write``
    (tokens written to it, Anthropic's cache creation) default to ``input``.
    """

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None

    def cost(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        cache_write_tokens: int = 0,
    ) -> float:
        """Dollars for one call: cache reads and writes at their rates, the rest at ``input``."""
        cached = min(cached_tokens, prompt_tokens)
        written = min(cache_write_tokens, prompt_tokens - cached)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        write_rate = self.input if self.cache_write is None else self.cache_write
        total = (
            (prompt_tokens - cached - written) * self.input
            + cached * cached_rate
            + written * write_rate
            + completion_tokens * self.output
        )
        return total / 1_000_000


#: EXAMPLE prices (USD per 1M tokens, as listed by OpenAI and Anthropic in 2025). They go stale;
#: pass your own ``price_table`` for numbers you can bill against.
DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4.1": Price(input=2.00, output=8.00, cached_input=0.50),
    "gpt-4.1-mini": Price(input=0.40, output=1.60, cached_input=0.10),
    "gpt-4.1-nano": Price(input=0.10, output=0.40, cached_input=0.025),
    "gpt-4o": Price(input=2.50, output=10.00, cached_input=1.25),
    "gpt-4o-mini": Price(input=0.15, output=0.60, cached_input=0.075),
    "claude-opus-4": Price(input=15.00, output=75.00, cached_input=1.50, cache_write=18.75),
    "claude-sonnet-4": Price(input=3.00, output=15.00, cached_input=0.30, cache_write=3.75),
    "claude-haiku-4": Price(input=1.00, output=5.00, cached_input=0.10, cache_write=1.25),
}


def price_for(model: str, table: Mapping[str, Price]) -> Price | None:
    """The price of ``model``: its exact entry, else the longest entry it starts with.

    So ``gpt-4.1-mini-2025-04-14`` (what the API reports) is priced as ``gpt-4.1-mini``.
    """
    if model in table:
        return table[model]
    prefixes = [name for name in table if model.startswith(name)]
    return table[max(prefixes, key=len)] if prefixes else None


@dataclasses.dataclass(frozen=True, slots=True)
class Tokens:
    """Counts for a set of model calls; ``cost`` sums the calls whose model has a price."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0
    unpriced_calls: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def tokens(self) -> int:
        """Same as ``total_tokens``."""
        return self.total_tokens

    def times(self, n: int) -> Tokens:
        """These counts ``n`` times over (a call asked ``n`` times)."""
        return Tokens(*(getattr(self, f.name) * n for f in dataclasses.fields(Tokens)))

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(Tokens))
        )

    def describe(self) -> str:
        """``5 model calls (12,345 tokens, $0.04)``."""
        calls = f"{self.calls} model call{'s' if self.calls != 1 else ''}"
        money = _money(self.cost) if self.calls > self.unpriced_calls else "no price"
        extra = f", {self.unpriced_calls} unpriced" if 0 < self.unpriced_calls < self.calls else ""
        return f"{calls} ({self.total_tokens:,} tokens, {money}{extra})"


def _money(cost: float) -> str:
    return f"${cost:.2f}" if cost >= 0.01 or cost == 0 else f"${cost:.4f}"


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """Model usage of a run: ``billed`` (called live now) and ``replayed`` (from the journal).

    ``interrupted`` counts the earlier requests of these calls: retried after a
    failure, or cut off by a crash after they may have reached the provider
    (their answers lost). Their cost is unknown; with any, ``billed`` is a
    lower bound.
    """

    billed: Tokens = Tokens()
    replayed: Tokens = Tokens()
    interrupted: int = 0

    @property
    def total(self) -> Tokens:
        """Billed plus replayed: what the whole conversation used."""
        return self.billed + self.replayed

    def summary(self) -> str:
        """One line for people, e.g. ``replayed 5 model calls (12,345 tokens, $0.04) from
        the journal instead of paying for them again; billed 2 model calls (...)``.

        Replayed calls are those served from the journal when the workflow re-ran,
        after a crash or after it parked; neither is paid again.
        """
        line = f"billed {self.billed.describe()}"
        if self.replayed.calls:
            line = (
                f"replayed {self.replayed.describe()} from the journal instead of paying for "
                f"them again; {line}"
            )
        if self.interrupted:
            n = self.interrupted
            line += (
                f"; {n} earlier model request{'s' if n != 1 else ''} retried after a failure "
                f"or a crash may have been billed too: billed at least {_money(self.billed.cost)}"
            )
        return line


def call_tokens(response: Mapping[str, Any]) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens from a chat completion's ``usage`` (0 when absent)."""
    usage = response.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return (
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )


def tokens_of(response: Mapping[str, Any], prices: Mapping[str, Price]) -> Tokens:
    """The Tokens of one call, priced by the model the response names."""
    prompt, completion, cached = call_tokens(response)
    details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
    written = int(details.get("cache_write_tokens") or 0)
    price = price_for(str(response.get("model") or ""), prices)
    cost = price.cost(prompt, completion, cached, written) if price else 0.0
    return Tokens(1, prompt, completion, cached, cost, 0 if price else 1, written)


class Meter:
    """A running tally of model calls, billed or replayed (already priced)."""

    def __init__(self) -> None:
        self.billed = Tokens()
        self.replayed = Tokens()
        self.interrupted = 0
        self.charged = Tokens()  # every answered call once per request made for it
        self.largest = Tokens()  # the most expensive single call so far

    def add(self, tokens: Tokens, *, live: bool, interrupted: int = 0) -> None:
        """Count one model call (and the ``interrupted`` requests made for it before).

        ``charged`` prices each earlier request like the answered one: what a
        budget counts, since a lost answer's own tokens are unknown.
        """
        if live:
            self.billed += tokens
        else:
            self.replayed += tokens
        self.interrupted += interrupted
        self.charged += tokens.times(1 + interrupted)
        if (tokens.cost, tokens.total_tokens) > (self.largest.cost, self.largest.total_tokens):
            self.largest = tokens

    def add_lost(self, tokens: Tokens, requests: int) -> None:
        """Count ``requests`` whose answers were lost, estimated as ``tokens`` (budgets only)."""
        self.interrupted += requests
        self.charged += tokens

    def usage(self) -> Usage:
        """The tally so far."""
        return Usage(self.billed, self.replayed, self.interrupted)


#: The meter of the agent run now executing, for what rolls up into it (sub-agents).
agent_meter: contextvars.ContextVar[Meter | None] = contextvars.ContextVar(
    "durably_agent_meter", default=None
)


def run_meter() -> Meter | None:
    """The tally of every model call of the workflow run now executing (None outside one)."""
    run = context.current_run.get()
    if run is None:
        return None
    return run.local(Meter, Meter)


def run_usage() -> Usage:
    """Usage of every model call (agents and ``llm`` wrappers) of the current workflow run.

    Billed means called live by this process in this run; replayed means served
    from the journal while the workflow was re-run after a restart. Each call is
    priced by the table of the agent or wrapper that made it.
    """
    meter = run_meter()
    return Usage() if meter is None else meter.usage()


def usage_from_history(
    entries: Iterable[journal.Entry], prices: Mapping[str, Price] | None = None
) -> Tokens:
    """The usage recorded in a workflow's journal: every completed model-call step.

    For ``durably show`` and dashboards: with the gap lines of the receipts it
    says how much a recovery would have re-bought without the journal.
    """
    table = DEFAULT_PRICES if prices is None else prices
    total = Tokens()
    for entry in entries:
        if (
            entry.kind != journal.Kind.STEP
            or not entry.name.startswith(MODEL_STEP_PREFIX)
            or entry.status != journal.EntryStatus.COMPLETED
        ):
            continue
        response = codec.decode(entry.payload or "null", where=f"model call at seq {entry.seq}")
        if isinstance(response, Mapping):
            total += tokens_of(response, table)
    return total


def requests_sent(entries: Iterable[journal.Entry]) -> int:
    """How many requests the journal's model-call steps sent, as far as it knows.

    A model step commits an intent before every attempt, so a completed entry's
    ``attempt`` counts the attempts started for it: the answered one, those that
    failed and were retried, and those cut off by a crash (their answers lost).
    """
    sent = 0
    for e in entries:
        if e.kind == journal.Kind.STEP and e.name.startswith(MODEL_STEP_PREFIX):
            sent += e.attempt
            refused = e.status == journal.EntryStatus.FAILED and "BudgetExceeded" in (
                e.payload or ""
            )
            sent -= 1 if refused else 0  # its last attempt stopped before the request
    return sent


def recovery_summary(
    entries: Sequence[journal.Entry],
    recovered_at: Sequence[float],
    prices: Mapping[str, Price] | None = None,
) -> str | None:
    """What the model calls of a journal cost, and what crash recoveries replayed.

    ``recovered_at`` are the times executors took the workflow over from a dead
    owner; the model calls finished before the last of them were served from
    the journal on recovery instead of being paid for again. When more requests
    were sent than answers journaled (a retry, or an answer lost to a crash)
    the cost is a lower bound, and the line says "billed at least".
    None without model calls.
    """
    calls = [e for e in entries if e.name.startswith(MODEL_STEP_PREFIX)]
    total = usage_from_history(calls, prices)
    if not total.calls:
        return None
    sent = requests_sent(calls)
    line = f"model usage: {total.describe()}"
    if sent > total.calls:
        extra = sent - total.calls
        line += (
            f"; {sent} requests sent ({extra} retried after a failure or a crash that may "
            f"have been billed too): billed at least {_money(total.cost)}"
        )
    else:
        line += ", each requested once"
    if recovered_at:
        last = max(recovered_at)
        before = [e for e in calls if (e.finished_at or e.started_at or 0.0) < last]
        replayed = usage_from_history(before, prices)
        if replayed.calls:
            line += f"; recovery replayed {replayed.describe()} instead of paying for them again"
    return line
