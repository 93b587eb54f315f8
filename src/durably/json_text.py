"""JSON text in one call into json's C code, without the per-call set-up in Python.

``json.JSONEncoder.encode`` builds a new C encoder on every call, and
``JSONDecoder.decode`` runs two regular expressions around the C scanner: on a
step's small payload that set-up costs as much as the work. These wrappers build
the C parts once. Their output and errors are exactly json's own; where the C
accelerator is missing (another interpreter) they are json's plain methods.
"""

from __future__ import annotations

import json
import json.decoder
import json.encoder
import json.scanner
from collections.abc import Callable
from typing import Any

_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_c_make_scanner: Any = getattr(json.scanner, "c_make_scanner", None)


def writer(default: Callable[[Any], Any], *, sort_keys: bool = False) -> Callable[[Any], str]:
    """A function writing compact, non-ASCII-escaping JSON that refuses NaN and infinities.

    The same text as ``json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
    allow_nan=False, check_circular=False, default=default, sort_keys=sort_keys).encode``.
    """
    plain = json.JSONEncoder(
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        check_circular=False,
        default=default,
        sort_keys=sort_keys,
    )
    if _c_make_encoder is None:  # pragma: no cover - CPython always has it
        return plain.encode
    c_encode = _c_make_encoder(
        None, default, json.encoder.encode_basestring, None, ":", ",", sort_keys, False, False
    )

    def encode(value: Any) -> str:
        if type(value) is str:  # the C encoder returns a top-level string unjoined
            return json.encoder.encode_basestring(value)
        return "".join(c_encode(value, 0))

    return encode


def reader(decoder: json.JSONDecoder) -> Callable[[str], Any]:
    """``decoder.decode`` for text with no whitespace around the value, the way ours is
    written; any other text (or an error) goes through ``decoder.decode`` itself, so
    its errors stay json's."""
    if _c_make_scanner is None:  # pragma: no cover - CPython always has it
        return decoder.decode
    scan = _c_make_scanner(decoder)
    slow = decoder.decode

    def decode(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except Exception:
            return slow(text)  # raises json's own error, with its message
        if end != len(text):
            return slow(text)  # surrounding whitespace, or extra data: json decides
        return value

    return decode
