"""``durably serve``: a JSON API and a server-rendered dashboard over one database.

Needs the ``server`` extra (``pip install 'durably[server]'``): Starlette,
uvicorn and Jinja2. See docs/dashboard.md. :mod:`durably.server.views` (the
JSON shapes of records) needs none of them: the command line's ``--json``
output uses it too, so ``create_app`` is imported only when asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from durably.server.app import create_app

        return create_app
    raise AttributeError(f"module 'durably.server' has no attribute {name!r}")
