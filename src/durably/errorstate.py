"""An exception's attributes beyond its ``args``: recorded with a step's error, restored on replay.

Why: a recorded error is re-raised on every replay, and the workflow's
``except`` clauses must take the path they took live. ``args`` alone cannot
rebuild a provider's error (``openai.BadRequestError(message, *, response,
body)`` keeps ``status_code``, ``code`` and ``body`` as attributes), an httpx
``HTTPStatusError`` (its ``request`` and ``response``) or a user exception whose
constructor takes keywords. So the instance's attributes are recorded beside
the args, and the exception is rebuilt the way pickle does it: the class called
with its args, else (a constructor that wants other arguments) created without
calling the constructor, then given its attributes back.

Attributes that are not JSON-storable are left out, except the HTTP request and
response objects of httpx (and of ``httpx2``, which newer ``openai`` uses): a
request keeps its method and URL, never its headers (they carry credentials); a
response keeps its status, a few headers that say why it failed (content type,
request id, retry-after, rate limits) and its body. Nothing is imported while
restoring: the HTTP classes come from modules already loaded.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

_HTTP_MODULES = ("httpx", "httpx2")
_KEPT_HEADERS = ("content-type", "retry-after", "retry-after-ms", "x-request-id", "request-id")
_KEPT_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "x-should-retry")
_MAX_BODY = 64 * 1024


def capture(exc: BaseException, to_json: Callable[[object], object]) -> dict[str, object] | None:
    """The attributes of ``exc`` worth restoring, as a JSON tree (None when there are none).

    ``to_json`` is the codec's converter; an attribute it refuses is left out.
    """
    try:
        attrs = dict(vars(exc))
    except TypeError:  # no __dict__
        return None
    plain: dict[str, object] = {}
    http: dict[str, object] = {}
    for name, value in attrs.items():
        if name.startswith("__"):  # __notes__ and the like: not state
            continue
        kind = _http_kind(value)
        if kind is not None:
            try:
                http[name] = _http_record(kind, value)
            except Exception:
                continue
            continue
        try:
            plain[name] = to_json(value)
        except Exception:
            continue
    if not plain and not http:
        return None
    return {"attrs": plain, "http": http}


def restore(state: object, from_json: Callable[[object], object]) -> dict[str, Any]:
    """The attributes ``capture`` recorded; HTTP objects rebuilt where their module is loaded."""
    if not isinstance(state, dict):
        return {}
    out: dict[str, Any] = {}
    attrs = from_json(state.get("attrs") or {})
    if isinstance(attrs, dict):
        out.update({str(k): v for k, v in attrs.items()})
    http = state.get("http")
    if isinstance(http, dict):
        for name, record in http.items():
            rebuilt = _http_object(record)
            if rebuilt is not None:
                out[str(name)] = rebuilt
    return out


def rebuild(
    cls: type[BaseException], attempts: list[tuple[object, ...]], attrs: dict[str, Any]
) -> BaseException | None:
    """``cls`` built from the first args its constructor accepts, then given ``attrs``.

    When no attempt fits the constructor but attributes were recorded, the
    instance is created without calling the constructor (as an unpickler would
    for a class with ``__reduce__``), with the first args as its ``args``.
    """
    for args in attempts:
        try:
            exc = cls(*args)
        except Exception:
            continue
        if isinstance(exc, cls):
            _set_attrs(exc, attrs)
            return exc
    if not attrs or not attempts:
        return None
    try:
        exc = cls.__new__(cls, *attempts[0])
        BaseException.__init__(exc, *attempts[0])
    except Exception:
        return None
    _set_attrs(exc, attrs)
    return exc


def _set_attrs(exc: BaseException, attrs: dict[str, Any]) -> None:
    for name, value in attrs.items():
        try:
            setattr(exc, name, value)
        except Exception:  # a read-only property: the constructor already set it
            continue


def _http_kind(value: object) -> str | None:
    t = type(value)
    if t.__module__.split(".")[0] in _HTTP_MODULES and t.__name__ in ("Request", "Response"):
        return t.__name__
    return None


def _http_record(kind: str, value: Any) -> dict[str, object]:
    module = type(value).__module__.split(".")[0]
    if kind == "Request":
        return {"module": module, "kind": kind, "method": value.method, "url": str(value.url)}
    headers = {
        k.lower(): v
        for k, v in value.headers.items()
        if k.lower() in _KEPT_HEADERS or k.lower().startswith(_KEPT_PREFIXES)
    }
    record: dict[str, object] = {
        "module": module,
        "kind": kind,
        "status_code": int(value.status_code),
        "headers": headers,
    }
    with contextlib.suppress(Exception):  # a stream not read: no body to keep
        record["body"] = value.content[:_MAX_BODY].decode("utf-8", errors="replace")
    request = None
    with contextlib.suppress(Exception):  # a response built without one
        request = value.request
    if request is not None:
        record["request"] = _http_record("Request", request)
    return record


def _http_object(record: object) -> Any:
    if not isinstance(record, dict):
        return None
    module = sys.modules.get(str(record.get("module")))
    if module is None or str(record.get("module")) not in _HTTP_MODULES:
        return None
    try:
        if record.get("kind") == "Request":
            return module.Request(str(record["method"]), str(record["url"]))
        body = record.get("body")
        return module.Response(
            int(record["status_code"]),
            headers=dict(record.get("headers") or {}),
            content=body.encode("utf-8") if isinstance(body, str) else b"",
            request=_http_object(record.get("request")),
        )
    except Exception:
        return None
