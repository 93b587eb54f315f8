"""Checks of the names and numbers users give durably, made once, before anything is stored.

Names (workflow ids and names, step, signal, event and queue names, idempotency
keys) end up in TEXT columns: PostgreSQL refuses a NUL character, and neither
backend can store a lone surrogate (what ``os.listdir`` returns for a file name
that is not UTF-8). Durations and counts are compared, added to clocks and
stored: NaN passes every ``<`` check, and infinity makes a wake-up time that
never comes. So each is checked where the user passes it, and the error names
the option and the value at that call rather than failing later at a commit.
"""

from __future__ import annotations

import math
import numbers

from durably import errors

__all__ = ["count", "name", "number"]


def name(value: object, what: str) -> str:
    """``value`` if it is a string a database can store as a name, else InvalidName.

    ``what`` says which name it is (``"signal name"``, ``"workflow id"``); the
    error quotes it with the offending character and its index.
    """
    if not isinstance(value, str):
        raise errors.InvalidName(f"{what} must be a string, not {type(value).__name__} {value!r}")
    if "\x00" in value:
        raise errors.InvalidName(
            f"{what} {value!r} contains a NUL character (\\x00) at index "
            f"{value.index(chr(0))}; databases cannot store it in a name"
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise errors.InvalidName(
                f"{what} {value!r} is not valid UTF-8 text: it holds the lone surrogate "
                f"{value[e.start]!r} at index {e.start} (bytes decoded with "
                "errors='surrogateescape'?); decode it with errors='replace' first"
            ) from None
    return value


def number(
    value: object,
    what: str,
    *,
    low: float = 0.0,
    above: bool = False,
    high: float | None = None,
    error: type[Exception] = ValueError,
) -> float:
    """``value`` as a float if it is a finite real number in range, else ``error``.

    The range is ``>= low`` (``> low`` with ``above``) and, with ``high``,
    ``<= high``. Booleans are refused: ``True`` is not a duration.
    """
    if type(value) is float or type(value) is int:  # the usual value: no ABC check
        f = float(value)
        if math.isfinite(f) and _in_range(f, low, above, high):
            return f
    rule = f"{'>' if above else '>='} {low:g}" if high is None else f"within [{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{what}={value!r}: must be a finite number {rule}")
    f = float(value)
    if not math.isfinite(f):
        raise error(f"{what}={value!r}: must be a finite number {rule}, not NaN or infinity")
    if not _in_range(f, low, above, high):
        raise error(f"{what}={value!r}: must be {rule}")
    return f


def _in_range(f: float, low: float, above: bool, high: float | None) -> bool:
    """``f >= low`` (``> low`` with ``above``) and, with ``high``, ``f <= high``."""
    return not (f < low or (above and f == low) or (high is not None and f > high))


def count(
    value: object,
    what: str,
    *,
    low: int = 1,
    high: int | None = None,
    error: type[Exception] = ValueError,
) -> int:
    """``value`` if it is an int (not a bool) ``>= low`` (and ``<= high``), else ``error``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        rule = f">= {low}" if high is None else f"within [{low}, {high}]"
        raise error(f"{what}={value!r}: must be an int {rule}")
    return value


#: The range of a BIGINT column (a queue priority).
BIGINT = (-(2**63), 2**63 - 1)
