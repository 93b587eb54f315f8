"""A minimal OpenAI-compatible client: ``chat.completions.create(**params)`` -> dict.

The real openai client validates and transforms every message of every request
(about 50 ms for 400 messages on the CI machine), which makes a 200-turn test
spend its time in the client, not in durably. The journal-growth test measures
bytes, so it uses this one; it also shows that any client with the same shape
works (a sync ``create`` runs in a step thread; a dict response is journaled as is).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class _Completions:
    def __init__(self, base_url: str) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"

    def create(self, *, extra_headers: dict[str, str] | None = None, **params: Any) -> Any:
        headers = {"Content-Type": "application/json", **(extra_headers or {})}
        request = urllib.request.Request(self._url, json.dumps(params).encode(), headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())


class _Chat:
    def __init__(self, base_url: str) -> None:
        self.completions = _Completions(base_url)


class RawClient:
    """``RawClient(base_url).chat.completions.create(model=..., messages=...)``."""

    max_retries = 0

    def __init__(self, base_url: str) -> None:
        self.chat = _Chat(base_url)

    def close(self) -> None:
        """Nothing to release: every request opens and closes its own connection."""
