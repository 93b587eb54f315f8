"""The Store verbs written once in SQL; dialects supply only what truly differs.

Every verb runs inside the transaction :meth:`SqlBase.run_batch` opened, with
queries from ``queries.sql``; the dialect hooks it relies on are declared in
:mod:`durably.storage.sqlbase`. A verb that makes something claimable, delivers
a signal or frees a place in a queue says so with ``_wake``, which a dialect
with notifications sends when the transaction commits.

The verbs live in one module per responsibility, each a class building on the
one before (so each may call the verbs below it, and the chain has no cycle):

- :mod:`~durably.storage.bulk`: export, import, prune, delete;
- :mod:`~durably.storage.claims`: workflow rows, search, claims, releases, executors;
- :mod:`~durably.storage.entries`: the fence and the journal writes (append, finish, park);
- :mod:`~durably.storage.signals`: signals, events and child workflows;
- :mod:`~durably.storage.reviews`: reopen, fork and reviews;
- :mod:`~durably.storage.cancels`: a cancel, and the deadlines that ask for one.

:class:`SqlStore` is the one interface the dialects subclass.
"""

from __future__ import annotations

from durably.storage import cancels


class SqlStore(cancels.CancelVerbs):
    """The verbs of a Store in SQL; subclasses are dialects."""
