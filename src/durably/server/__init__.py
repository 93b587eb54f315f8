"""``durably serve``: a JSON API and a server-rendered dashboard over one database.

Needs the ``server`` extra (``pip install 'durably[server]'``): Starlette,
uvicorn and Jinja2. See docs/dashboard.md.
"""

from __future__ import annotations

from durably.server.app import create_app

__all__ = ["create_app"]
