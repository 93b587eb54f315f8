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

import dataclasses
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from durably import codec, context, journal

MODEL_STEP_PREFIX = "llm:"


@dataclasses.dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens: prompt, completion, and cached prompt tokens.

    ``cached_input`` defaults to ``input`` (no discount) when not given.
    """

    input: float
    output: float
    cached_input: float | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> float:
        """Dollars for one call: cached prompt tokens at the cached rate, the rest at ``input``."""
        cached = min(cached_tokens, prompt_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        total = (
            (prompt_tokens - cached) * self.input
            + cached * cached_rate
            + completion_tokens * self.output
        )
        return total / 1_000_000


#: EXAMPLE prices (USD per 1M tokens, as listed by OpenAI in 2025). They go stale;
#: pass your own ``price_table`` for numbers you can bill against.
DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4.1": Price(input=2.00, output=8.00, cached_input=0.50),
    "gpt-4.1-mini": Price(input=0.40, output=1.60, cached_input=0.10),
    "gpt-4.1-nano": Price(input=0.10, output=0.40, cached_input=0.025),
    "gpt-4o": Price(input=2.50, output=10.00, cached_input=1.25),
    "gpt-4o-mini": Price(input=0.15, output=0.60, cached_input=0.075),
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

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def tokens(self) -> int:
        """Same as ``total_tokens``."""
        return self.total_tokens

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
    """Model usage of a run: ``billed`` (called live now) and ``replayed`` (from the journal)."""

    billed: Tokens = Tokens()
    replayed: Tokens = Tokens()

    @property
    def total(self) -> Tokens:
        """Billed plus replayed: what the whole conversation used."""
        return self.billed + self.replayed

    def summary(self) -> str:
        """One line for people, e.g. ``recovery replayed 5 model calls (12,345 tokens,
        $0.04) instead of paying for them again; billed 2 model calls (...)``."""
        billed = f"billed {self.billed.describe()}"
        if not self.replayed.calls:
            return billed
        return (
            f"recovery replayed {self.replayed.describe()} instead of paying for them again; "
            f"{billed}"
        )


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
    price = price_for(str(response.get("model") or ""), prices)
    cost = price.cost(prompt, completion, cached) if price else 0.0
    return Tokens(1, prompt, completion, cached, cost, 0 if price else 1)


class Meter:
    """A running tally of model calls, billed or replayed (already priced)."""

    def __init__(self) -> None:
        self.billed = Tokens()
        self.replayed = Tokens()

    def add(self, tokens: Tokens, *, live: bool) -> None:
        """Count one model call."""
        if live:
            self.billed += tokens
        else:
            self.replayed += tokens

    def usage(self) -> Usage:
        """The tally so far."""
        return Usage(self.billed, self.replayed)


_run_meters: weakref.WeakKeyDictionary[Any, Meter] = weakref.WeakKeyDictionary()


def run_meter() -> Meter | None:
    """The tally of every model call of the workflow run now executing (None outside one)."""
    run = context.current_run.get()
    if run is None:
        return None
    meter = _run_meters.get(run)
    if meter is None:
        meter = _run_meters[run] = Meter()
    return meter


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


def recovery_summary(
    entries: Sequence[journal.Entry],
    recovered_at: Sequence[float],
    prices: Mapping[str, Price] | None = None,
) -> str | None:
    """What the model calls of a journal cost, and what crash recoveries replayed.

    ``recovered_at`` are the times executors took the workflow over from a dead
    owner; the model calls finished before the last of them were served from
    the journal on recovery instead of being paid for again. None without model calls.
    """
    calls = [e for e in entries if e.name.startswith(MODEL_STEP_PREFIX)]
    total = usage_from_history(calls, prices)
    if not total.calls:
        return None
    line = f"model usage: {total.describe()}, each billed once"
    if recovered_at:
        last = max(recovered_at)
        before = [e for e in calls if (e.finished_at or e.started_at or 0.0) < last]
        replayed = usage_from_history(before, prices)
        if replayed.calls:
            line += f"; recovery replayed {replayed.describe()} instead of paying for them again"
    return line
