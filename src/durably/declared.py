"""Recorded results decoded into the type the code declares today.

A step's result is stored with the class path it had when it ran
(``"app:Order"``, see :mod:`durably.codec`). Workflows outlive deploys: by the
time a parked workflow replays, the class may be renamed, moved, or have gained
a field. So a recorded result is decoded in two ways, as Temporal's payload
converter does from the type hint:

1. by the class path stored with it, as before; the value is kept when it is
   of the type the step declares (its return annotation) or the step declares
   none that can be checked (``dict``, ``str``, no annotation: builtin
   annotations are taken loosely, as they always were);
2. otherwise from its *shape* (the data without its classes, see
   :func:`codec.decode_shape`) into the declared type: pydantic models
   (``model_validate``), dataclasses, TypedDicts, Enums, builtins, and
   ``list``/``tuple``/``set``/``dict``/``Optional``/``Union`` of them.

Only when neither gives a value does decoding fail, with
:class:`~durably.errors.IncompatibleValue` naming the stored value's shape and
today's type; the step runner turns that into a ``diverged`` workflow, which
``resume`` picks up again once compatible code is deployed.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

from durably import codec, errors

__all__ = ["NOTHING", "declared_result", "decode_result", "type_text"]


class _Nothing:
    """No usable declaration: no return annotation, ``Any``, or one that cannot be resolved."""

    def __repr__(self) -> str:
        return "durably.declared.NOTHING"


NOTHING: Any = _Nothing()


class _Mismatch(Exception):
    """A shape does not fit a type; ``path`` collects the way to it while unwinding."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


def declared_result(fn: Callable[..., Any]) -> Any:
    """The return annotation of ``fn``, resolved; NOTHING when there is none to go by.

    Resolved when first asked (a forward reference names a class defined later in
    the module), and remembered once it resolves.
    """
    try:
        return _resolved(fn)
    except Exception:  # unresolvable (NameError), unhashable, not a function
        return NOTHING


@functools.lru_cache(maxsize=4096)
def _resolved(fn: Callable[..., Any]) -> Any:
    hints = typing.get_type_hints(fn, include_extras=True)
    hint = hints.get("return", NOTHING)
    if hint is Any or hint is object:
        return NOTHING
    return hint


def decode_result(text: str, declared: Any, *, where: str) -> object:
    """The recorded value ``text`` as today's code expects it (``declared`` its type).

    Raises IncompatibleValue when neither the stored class nor the declared
    type can take it, and DecodeError for text that is not a stored value at all.
    """
    try:
        value: object = codec.decode(text, where=where)
    except errors.DecodeError as exc:
        failure: errors.DecodeError | None = exc
        value = None
    else:
        failure = None
        if declared is NOTHING or not _checks(declared) or _conforms(value, declared):
            return value
    stored = codec.describe_stored(text)
    if stored == "corrupt JSON":
        assert failure is not None
        raise failure
    expected = type_text(declared) if declared is not NOTHING else "none declared"
    if declared is NOTHING:
        assert failure is not None
        reason = f"{_after_colon(failure)}; the step declares no return type to decode it into"
        raise errors.IncompatibleValue(
            f"cannot decode {where}: {reason}", stored=stored, expected=expected, reason=reason
        ) from failure
    try:
        return _convert(codec.decode_shape(text, where=where), declared)
    except _Mismatch as exc:
        if failure is None:
            return value  # the stored class still decodes: a loose annotation, kept as it was
        at = "".join(reversed(exc.path))
        reason = f"{'value' + at if at else 'the value'} {exc.reason}"
        raise errors.IncompatibleValue(
            f"cannot decode {where} as {expected}: {reason} (stored: {stored})",
            stored=stored,
            expected=expected,
            reason=reason,
        ) from failure


def _after_colon(exc: BaseException) -> str:
    """A DecodeError's reason without its ``cannot decode WHERE:`` prefix."""
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("cannot decode ") and ": " in text else text


def type_text(hint: Any) -> str:
    """A type as people read it in an error: ``app:Order``, ``list[app:Order] | None``."""
    if hint is NOTHING:
        return "none"
    if hint is None or hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_text(a) for a in args)
        return f"{type_text(origin)}[{inner}]" if args else type_text(origin)
    if isinstance(hint, type):
        if hint.__module__ == "builtins":
            return hint.__qualname__
        return f"{hint.__module__}:{hint.__qualname__}"
    return repr(hint)


# --- is the decoded value of the declared type? -----------------------------------------


def _is_class_type(hint: Any) -> bool:
    """A type whose instances ``codec`` stores with their class path."""
    if not isinstance(hint, type):
        return False
    if dataclasses.is_dataclass(hint) or issubclass(hint, enum.Enum):
        return True
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and issubclass(hint, pydantic.BaseModel)


def _checks(hint: Any) -> bool:
    """Whether ``hint`` names a class anywhere that a decoded value must be an instance of."""
    try:
        return _checks_cached(hint)
    except TypeError:  # an unhashable hint: look without the cache
        return _checks_uncached(hint)


@functools.lru_cache(maxsize=1024)
def _checks_cached(hint: Any) -> bool:
    return _checks_uncached(hint)


def _checks_uncached(hint: Any) -> bool:
    if _is_class_type(hint):
        return True
    return any(_checks_uncached(a) for a in typing.get_args(hint) if a is not Ellipsis)


def _conforms(value: object, hint: Any) -> bool:
    """Whether every class the hint names is matched by an instance of it in ``value``.

    Builtin parts of a hint are not checked: the stored value came back exactly
    as it was stored, and annotations such as ``-> dict`` are often loose.
    """
    if _is_class_type(hint):
        return isinstance(value, hint)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if not args:
        return True
    if origin is typing.Annotated:
        return _conforms(value, args[0])
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is tuple and isinstance(value, tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(args) == len(value) and all(map(_conforms, value, args))
    if _is_mapping(origin) and isinstance(value, dict):
        return all(_conforms(v, args[-1]) for v in value.values())
    if _is_collection(origin) and isinstance(value, list | tuple | set | frozenset):
        return all(_conforms(v, args[0]) for v in value)
    return True


def _is_mapping(origin: Any) -> bool:
    return isinstance(origin, type) and issubclass(origin, collections.abc.Mapping)


def _is_collection(origin: Any) -> bool:
    return (
        isinstance(origin, type)
        and issubclass(origin, collections.abc.Collection)
        and not issubclass(origin, str | bytes | collections.abc.Mapping)
    )


# --- building the declared type from the shape ------------------------------------------


def _convert(value: object, hint: Any) -> object:
    """``value`` (a shape: plain data) as an instance of ``hint``; _Mismatch if it cannot be."""
    if hint is NOTHING or hint is Any or hint is object or isinstance(hint, typing.TypeVar):
        return value
    if hint is None or hint is type(None):
        if value is None:
            return None
        raise _Mismatch(f"is {_what(value)}, not None")
    supertype = getattr(hint, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return _convert(value, supertype)
    origin = typing.get_origin(hint)
    if origin is not None:
        return _convert_generic(value, hint, origin, typing.get_args(hint))
    if not isinstance(hint, type):
        return value  # a typing construct we do not check (a Protocol, a string)
    return _convert_class(value, hint)


def _convert_generic(value: object, hint: Any, origin: Any, args: tuple[Any, ...]) -> object:
    if origin is typing.Annotated:
        return _convert(value, args[0])
    if origin in (typing.Union, types.UnionType):
        for arm in args:  # an arm the value already is an instance of first
            if isinstance(arm, type) and type(value) is arm:
                return value
        reasons = []
        for arm in args:
            try:
                return _convert(value, arm)
            except _Mismatch as exc:
                reasons.append(exc.reason)
        raise _Mismatch(f"fits none of {type_text(hint)} ({'; '.join(reasons)})")
    if origin is typing.Literal:
        if value in args:
            return value
        raise _Mismatch(f"is {value!r}, not one of {', '.join(map(repr, args))}")
    if origin is tuple:
        items = _items(value, hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_at(i, x, args[0]) for i, x in enumerate(items))
        if args and len(args) != len(items):
            raise _Mismatch(f"has {len(items)} items, {type_text(hint)} has {len(args)}")
        return tuple(_at(i, x, a) for i, (x, a) in enumerate(zip(items, args, strict=False)))
    if _is_mapping(origin):
        if not isinstance(value, dict):
            raise _Mismatch(f"is {_what(value)}, not a mapping")
        key, val = (*args, Any, Any)[:2]
        return {_convert(k, key): _at(k, v, val) for k, v in value.items()}
    if _is_collection(origin):
        items = _items(value, hint)
        element = args[0] if args else Any
        converted = [_at(i, x, element) for i, x in enumerate(items)]
        if origin in (set, frozenset, collections.abc.Set, collections.abc.MutableSet):
            return (frozenset if origin is frozenset else set)(converted)
        return converted
    if isinstance(origin, type):
        return _convert_class(value, origin)
    return value


def _items(value: object, hint: Any) -> list[object]:
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    raise _Mismatch(f"is {_what(value)}, not a {type_text(hint)}")


def _at(key: object, value: object, hint: Any) -> object:
    """``_convert(value, hint)``, adding ``[key]`` to the path if it fails."""
    try:
        return _convert(value, hint)
    except _Mismatch as exc:
        exc.path.append(f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]")
        raise


def _convert_class(value: object, cls: type) -> object:
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(cls, pydantic.BaseModel):
        if not isinstance(value, dict):
            raise _Mismatch(f"is {_what(value)}, not the fields of {type_text(cls)}")
        try:
            return codec.validate_model(cls, value)
        except pydantic.ValidationError as exc:
            raise _Mismatch(f"does not fit {type_text(cls)}: {_pydantic_reasons(exc)}") from None
    if dataclasses.is_dataclass(cls):
        return _dataclass(value, cls)
    if typing.is_typeddict(cls):
        return _typeddict(value, cls)
    if issubclass(cls, enum.Enum):
        try:
            return cls(value)
        except ValueError:
            raise _Mismatch(f"is {value!r}, not a value of {type_text(cls)}") from None
    if cls is float and type(value) is int:
        return float(value)
    if cls is int and isinstance(value, bool):
        raise _Mismatch(f"is {_what(value)}, not int")
    if isinstance(value, cls):
        return value
    raise _Mismatch(f"is {_what(value)}, not {type_text(cls)}")


def _dataclass(value: object, cls: type) -> object:
    if not isinstance(value, dict):
        raise _Mismatch(f"is {_what(value)}, not the fields of {type_text(cls)}")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = dataclasses.fields(cls)
    missing = [
        f.name
        for f in fields
        if f.init
        and f.name not in value
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        names = ", ".join(map(repr, missing))
        raise _Mismatch(f"lacks the field(s) {names} that {type_text(cls)} requires")
    given = [f for f in fields if f.name in value]
    built = {f.name: _at(f.name, value[f.name], hints.get(f.name, Any)) for f in given}
    obj = cls(**{f.name: built[f.name] for f in fields if f.init and f.name in built})
    for f in fields:
        if not f.init and f.name in built:
            object.__setattr__(obj, f.name, built[f.name])
    return obj


def _typeddict(value: object, cls: type) -> object:
    if not isinstance(value, dict):
        raise _Mismatch(f"is {_what(value)}, not a {type_text(cls)}")
    required: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
    missing = sorted(required - value.keys())
    if missing:
        names = ", ".join(map(repr, missing))
        raise _Mismatch(f"lacks the key(s) {names} that {type_text(cls)} requires")
    hints = typing.get_type_hints(cls, include_extras=True)
    return {k: _at(k, v, hints.get(k, Any)) for k, v in value.items()}


def _pydantic_reasons(exc: Any) -> str:
    """The first few of a ValidationError's complaints, as ``field: message``."""
    shown = []
    for err in exc.errors()[:3]:
        where = ".".join(str(part) for part in err.get("loc", ())) or "value"
        shown.append(f"{where}: {err.get('msg', '?')}")
    more = exc.error_count() - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _what(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:6]))
        return f"a dict {{{keys}{', ...' if len(value) > 6 else ''}}}"
    return f"a {type(value).__name__}"
