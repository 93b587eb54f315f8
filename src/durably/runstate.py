"""The life of one workflow run as a state machine, and where its cancellation stands.

Pure data: :class:`durably.workflow_run.Run` holds one :class:`State` and one
:class:`Cancellation` and makes the transitions listed here; nothing else sets them.
"""

from __future__ import annotations

import dataclasses
import enum


class State(enum.Enum):
    """Where a run is in its life; ``Run.state``.

    ========= =================================================================
    state     meaning
    ========= =================================================================
    RUNNING   the workflow's code runs and may make durable calls
    PARKING   every branch waits: a park is on its way to the store
    PARKED    the store parked the workflow; its waits unwound (Suspended)
    CLOSING   the workflow function ended; running steps commit, none starts
    RETIRED   the workflow task ended: every later write is refused
    LOST      another executor took the workflow (its epoch is later)
    ABANDONED the database stopped answering; the run wrote what it could
    ========= =================================================================

    Transitions (``Run`` makes no other):

    ========= ================================ ===================================
    from      to                               when
    ========= ================================ ===================================
    RUNNING   PARKING                          the hold ran out with every branch blocked
    CLOSING   PARKING                          the same, while steps of ended code commit
    PARKING   the state it came from           the store found a reason to go on
    PARKING   CLOSING                          the function ended while a park was on its way
    any       PARKED                           a park reached the store or nothing more
                                               can be written (a LOST or ABANDONED run
                                               parks, without passing PARKING, to
                                               unwind its waits; a RETIRED one when the
                                               park was on its way as the task ended)
    RUNNING   CLOSING                          the function returned or raised
    RUNNING,  LOST                             a write was fenced or the heartbeat saw
    CLOSING,                                   a later epoch
    PARKING
    RUNNING,  ABANDONED                        the database kept failing
    CLOSING,
    PARKING
    any but   RETIRED                          the workflow task ended (``retire``); a
    PARKED                                     PARKED run stays PARKED, so the engine
                                               can tell a parked run from an ended one
    ========= ================================ ===================================

    Only RUNNING, PARKING and CLOSING hold the workflow (``Run.let_go`` is the
    opposite); the liveness check is ``Run._check_live``.
    """

    RUNNING = "running"
    PARKING = "parking"
    PARKED = "parked"
    CLOSING = "closing"
    RETIRED = "retired"
    LOST = "lost"
    ABANDONED = "abandoned"


#: The states in which a run holds its workflow and may write (a tuple: the test is by
#: identity, cheaper than hashing an enum member on every durable call).
HOLDING = (State.RUNNING, State.CLOSING, State.PARKING)


@dataclasses.dataclass(slots=True)
class Cancellation:
    """Whether cancellation of the workflow was asked, and where it stands in this run."""

    requested: bool = False
    delivered: bool = False  # Cancelled was raised into the workflow's code
    in_journal: bool = False  # the journal holds its delivery: a replay raises it at that seq
    deadline: float | None = None  # the workflow's deadline: past it, cancellation is asked

    @property
    def due(self) -> bool:
        """True when the next durable call that is not final must raise Cancelled."""
        return self.requested and not self.delivered and not self.in_journal
