"""What a long-lived loop of the engine does with an error it did not expect.

The heartbeat, the recovery loop, the retention loop and PostgreSQL's LISTEN thread
each expect the store's errors (``StoreError``, ``psycopg.Error``) and go on after
them. Anything else -- an ``OSError`` or ``ValueError`` from a driver, a bug -- once
ended the loop for good while the engine looked alive: its leases lapsed, it claimed
no more work, or a wake-up waited for the poll. Such a loop now logs the error with
its traceback once per kind (its type and the line that raised it), not at every turn;
waits a back-off that doubles while the errors go on, so a bug that fails every turn
does not spin a CPU; and goes on. A cancellation is no ``Exception``: it still ends
the loop.

Why not stop the engine instead: its runs are safe either way (a lease that is not
renewed lapses, and the fence refuses the commits of a run that lost its workflow), and
an error of one turn -- a driver's transient ``OSError`` -- would otherwise stop every
workflow of a healthy process. A loop that keeps failing says so once, loudly, with
its traceback, and says again when it works.
"""

from __future__ import annotations

import logging

log = logging.getLogger("durably")


class LoopErrors:
    """The unexpected errors of one loop (named ``what`` in its logs), and its back-off.

    Not thread-safe: each loop, task or thread, has its own.
    """

    def __init__(self, what: str, first: float = 0.05, most: float = 2.0) -> None:
        self.what = what
        self._first = first
        self._most = most
        self._seen: set[tuple[str, str, int]] = set()
        self._told = False  # this run of failures logged an error: its end is logged too
        self.failures = 0  # in a row, since the loop last did its work

    def failed(self, exc: Exception) -> float:
        """Log ``exc`` (with its traceback the first time of its kind); the seconds to wait
        before the next turn."""
        self.failures += 1
        kind = _kind(exc)
        if kind not in self._seen:
            self._seen.add(kind)
            self._told = True
            log.error(
                "%s met an unexpected error and goes on after a pause (logged once for "
                "this kind of error): %s: %s",
                self.what,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
        else:
            log.debug("%s failed again (%d in a row): %r", self.what, self.failures, exc)
        return min(self._most, self._first * 2.0 ** min(self.failures - 1, 16))

    def succeeded(self) -> None:
        """The loop did its work: reset the back-off, and say so if its failures were
        logged (not after each failure of a kind already logged: that would be every turn
        of a loop that fails every other turn)."""
        if self.failures:
            if self._told:
                log.warning("%s works again after %d failure(s)", self.what, self.failures)
            self.failures, self._told = 0, False


def _kind(exc: BaseException) -> tuple[str, str, int]:
    """The type of ``exc`` and where it was raised (the innermost frame of its traceback)."""
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    tb = exc.__traceback__
    if tb is None:
        return name, "", 0
    while tb.tb_next is not None:
        tb = tb.tb_next
    return name, tb.tb_frame.f_code.co_filename, tb.tb_lineno
