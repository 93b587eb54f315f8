"""JSON payloads for the journal: step results, workflow inputs and outputs, and errors.

Values are stored as compact JSON text. Plain JSON data (dicts with str keys, lists,
str, int, float, bool, None) is written as is; every other supported type becomes a
tagged object ``{"__durably__": "<tag>", ...}`` so it comes back with the same type:
tuple, set, frozenset, dicts with non-str keys (or a ``"__durably__"`` key), bytes,
datetime, date, time, timedelta, Decimal, UUID, pathlib paths, Enum members,
dataclass instances and pydantic v2 models. Timezones are kept as fixed UTC offsets.
Ints too long for Python's int-to-text limit are tagged and written in hex.

Text must be valid UTF-8, which both databases require: a string holding a lone
surrogate (what ``os.listdir`` returns for a file name that is not UTF-8) raises
EncodeError naming its path in the value, so it is refused before a commit.

There is no pickle, and nothing read from storage is imported or executed by name.
A class recorded in the journal (``"module:qualname"`` for values, ``"module.QualName"``
for errors) is looked up in ``sys.modules`` only, never imported, and it must be of
the kind its tag promises (dataclass, pydantic ``BaseModel`` subclass, Enum, exception).
The only code that runs while decoding is that class's own constructor (or
``model_validate``). So the modules that define your payload classes must be imported
before a workflow resumes; otherwise decoding raises ``DecodeError`` saying so.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import inspect
import json
import math
import reprlib
import sys
import traceback
import uuid
from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path, PosixPath, PurePath, PurePosixPath, PureWindowsPath, WindowsPath
from types import ModuleType
from typing import Any, TypeVar

from durably import errors, errorstate, json_text

__all__ = [
    "decode",
    "decode_error",
    "decode_shape",
    "describe_stored",
    "encode",
    "encode_error",
    "validate_model",
]

_MARK = "__durably__"
_MARK_TEXT = '"__durably__"'
_STR: frozenset[type] = frozenset({str})
_LEAF: frozenset[type] = frozenset({str, int, float, bool, type(None)})
# json's C encoder writes these (and their subclasses) itself, without the default hook.
_NATIVE = (str, int, float, list, dict, tuple)
_PATH_TYPES: dict[str, type[PurePath]] = {
    c.__name__: c for c in (PurePath, PurePosixPath, PureWindowsPath, Path, PosixPath, WindowsPath)
}
_SUPPORTED = (
    "plain JSON data, tuple, set, frozenset, bytes, datetime, date, time, "
    "timedelta, Decimal, UUID, pathlib path, Enum, dataclass or pydantic model"
)
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 40
_TIMEDELTA = ("days", "seconds", "microseconds")
# Ints longer than this are stored as hex ("int" tag): Python refuses to convert ints of
# more than 4,300 decimal digits (sys.get_int_max_str_digits()), and 14,000 bits stay below.
_BIG_INT_BITS = 14_000
_CLASS_PATHS: dict[type, str] = {}
_T = TypeVar("_T")


class _Fail(Exception):
    """A value cannot be encoded; ``path`` collects the way to it while unwinding."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


class _Bad(Exception):
    """A stored payload cannot be decoded; ``decode`` adds where it came from."""


# --- encoding ----------------------------------------------------------------


def encode(value: object, *, where: str) -> str:
    """JSON text for ``value``, tagging non-JSON types so they decode to the same type.

    Raises EncodeError naming ``where``, the offending type and its path in the value.
    """
    try:
        if _plain(value):
            try:
                text = _write(value)
            except (_Fail, ValueError):
                pass  # walk the value again below, which finds the path to the culprit
            else:
                # ensure_ascii=False writes lone surrogates as they are, and no database
                # can store them: check the text once here, walk the value only if it fails
                if text.isascii() or _is_utf8(text):
                    return text
        text = _write(_to_json(value))  # the walk checks every string on its way
        if text.isascii() or _is_utf8(text):
            return text
        raise _Fail("holds text that is not valid UTF-8 (a lone surrogate) somewhere")
    except _Fail as e:
        last = where.rsplit(" ", 1)[-1]
        root = last if last.isidentifier() else "value"
        at = root + "".join(reversed(e.path))
        raise errors.EncodeError(f"cannot encode {where}: {at} {e.reason}") from None
    except RecursionError:
        raise errors.EncodeError(
            f"cannot encode {where}: it is nested too deeply or contains a reference cycle"
        ) from None
    except ValueError as e:
        raise errors.EncodeError(f"cannot encode {where}: {e}") from None


def _plain(v: object) -> bool:
    """True when json's C encoder plus the default hook writes ``v`` exactly.

    That rules out tuples, subclasses of JSON types, non-str keys and the tag key,
    which json would silently turn into something else.
    """
    if type(v) is dict:
        if _MARK in v or not _STR.issuperset(map(type, v)):
            return False
        v = v.values()
    elif type(v) is not list:
        return type(v) in _LEAF or not isinstance(v, _NATIVE)
    for x in v:  # inlined leaf checks: this loop is the whole cost of the fast path
        t = type(x)
        if t in _LEAF:
            continue
        if t is dict or t is list:
            if not _plain(x):
                return False
        elif isinstance(x, _NATIVE):
            return False
    return True


def _to_json(v: object) -> object:
    """The JSON tree (plain dicts, lists and scalars) that stands for ``v``."""
    t = type(v)
    if t in _LEAF:
        if t is str:
            if not v.isascii():  # type: ignore[attr-defined]
                _check_text(v)  # type: ignore[arg-type]
        elif t is float and not math.isfinite(v):  # type: ignore[arg-type]
            raise _Fail(f"is the float {v!r}; JSON has no NaN or infinity")
        elif t is int and v.bit_length() > _BIG_INT_BITS:  # type: ignore[attr-defined]
            return {_MARK: "int", "hex": hex(v)}  # type: ignore[arg-type]
        return v
    convert = _CONVERTERS.get(t)
    if convert is not None:
        return convert(v)
    if isinstance(v, enum.Enum):
        return {_MARK: "enum", "class": _class_path(t), "value": _child(v.value, "value", ".")}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        tag = "dataclass"
    elif (pydantic := sys.modules.get("pydantic")) and isinstance(v, pydantic.BaseModel):
        tag = "pydantic"
    else:
        raise _Fail(_why(v))
    path = _class_path(t)
    try:
        fields = _read_fields(v)
    except Exception as e:
        raise _Fail(f"is a {_type_name(t)} whose fields cannot be read: {e!r}") from e
    if _MARK in fields:  # a field named like the tag key: store as escaped pairs
        return {_MARK: tag, "class": path, "fields": _dict_pairs(fields)}
    return {_MARK: tag, "class": path, "fields": {n: _child(x, n, ".") for n, x in fields.items()}}


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(s: str, what: str = "is the string") -> str:
    """``s`` if UTF-8 can hold it; else _Fail naming the lone surrogate and where it is."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Fail(
            f"{what} {_REPR.repr(s)}, which is not valid UTF-8: it holds the lone surrogate "
            f"{s[e.start]!r} at index {e.start} (bytes decoded with errors='surrogateescape', "
            "as os.listdir does for names that are not UTF-8?); decode the bytes with "
            "errors='replace', or store them as bytes"
        ) from None
    return s


def _read_fields(v: Any) -> dict[str, object]:
    """Attribute values of a dataclass instance or pydantic model, by name."""
    if dataclasses.is_dataclass(v):
        return {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
    dumped: dict[str, object] = v.model_dump(mode="python", round_trip=True)
    return dumped


def _child(value: object, key: object, style: str = "[]") -> object:
    """``_to_json(value)``, adding ``key`` to the error path if it fails."""
    try:
        return _to_json(value)
    except _Fail as e:
        e.path.append(f".{key}" if style == "." else f"{style[0]}{_REPR.repr(key)}{style[1]}")
        raise


def _dict(d: dict[Any, Any]) -> object:
    if _MARK not in d and _STR.issuperset(map(type, d)):
        for k in d:
            if not k.isascii():
                _check_text(k, "has the key")
        return {k: _child(x, k) for k, x in d.items()}
    return _dict_pairs(d)


def _dict_pairs(d: dict[Any, Any]) -> object:
    return {_MARK: "dict", "items": [[_child(k, k), _child(x, k)] for k, x in d.items()]}


def _set(s: set[Any] | frozenset[Any]) -> object:
    items = [_child(x, x, "{}") for x in s]
    items.sort(key=_SORTER.encode)  # stable text whatever the hash seed
    return {_MARK: type(s).__name__, "items": items}


def _iso(v: date | time) -> object:
    out: dict[str, object] = {_MARK: type(v).__name__, "iso": v.isoformat()}
    offset = v.utcoffset() if isinstance(v, datetime | time) else None
    if offset is not None and offset.microseconds:  # 3.11 misreads e.g. "+00:00:00.5"
        out["offset_us"] = offset // timedelta(microseconds=1)
    return out


def _why(v: object) -> str:
    """Why ``v`` cannot be stored, for the EncodeError message."""
    if isinstance(v, type):
        return f"is the class {_type_name(v)}; only instances can be stored"
    name = _type_name(type(v))
    bases = [b for b in type(v).__mro__[1:] if b in _CONVERTERS or b in _LEAF]
    if bases:
        return (
            f"is a {name}, a subclass of {bases[0].__name__}; convert it to a plain "
            f"{bases[0].__name__} (or use a dataclass) before storing it"
        )
    return f"is a {name}, which durably cannot store as JSON (supported: {_SUPPORTED})"


def _type_name(t: type) -> str:
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _class_path(cls: type) -> str:
    """``module:qualname`` of ``cls``, checked to lead back to ``cls`` when decoding."""
    path = _CLASS_PATHS.get(cls)
    if path is None:
        path = f"{cls.__module__}:{cls.__qualname__}"
        if _lookup(cls.__module__, cls.__qualname__) is not cls:
            raise _Fail(
                f"is a {_type_name(cls)}, which cannot be found again as {path!r} "
                "(classes defined inside functions cannot be restored); "
                "define it at module level"
            )
        _CLASS_PATHS[cls] = path
    return path


def _lookup(module_name: str, qualname: str) -> object:
    """The object at ``qualname`` in an already-loaded module, or None; imports nothing."""
    obj: object = sys.modules.get(module_name)
    for part in qualname.split("."):
        if not isinstance(obj, (type, ModuleType)):
            return None
        obj = vars(obj).get(part)
    return obj


_CONVERTERS: dict[type, Callable[[Any], object]] = {
    dict: _dict,
    list: lambda v: [_child(x, i) for i, x in enumerate(v)],
    tuple: lambda v: {_MARK: "tuple", "items": [_child(x, i) for i, x in enumerate(v)]},
    set: _set,
    frozenset: _set,
    bytes: lambda v: {_MARK: "bytes", "b64": base64.b64encode(v).decode("ascii")},
    datetime: _iso,
    date: _iso,
    time: _iso,
    timedelta: lambda v: {_MARK: "timedelta", **{k: getattr(v, k) for k in _TIMEDELTA}},
    Decimal: lambda v: {_MARK: "decimal", "value": str(v)},
    uuid.UUID: lambda v: {_MARK: "uuid", "hex": v.hex},
    **{
        c: lambda v: {_MARK: "path", "kind": type(v).__name__, "path": _check_text(str(v))}
        for c in _PATH_TYPES.values()
    },
}
_write = json_text.writer(_to_json)
_SORTER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True)


# --- decoding ----------------------------------------------------------------


def decode(text: str, *, where: str) -> object:
    """The value ``encode`` was given. Corrupt JSON or a bad tag raises DecodeError."""
    try:
        if _MARK_TEXT not in text:
            return _read_plain(text)
        return _read_tagged(text)
    except _Bad as e:
        raise errors.DecodeError(f"cannot decode {where}: {e}") from e.__cause__
    except json.JSONDecodeError as e:
        raise errors.DecodeError(f"cannot decode {where}: corrupt JSON ({e})") from None
    except ValueError as e:  # json's int(): more digits than sys.get_int_max_str_digits()
        raise errors.DecodeError(f"cannot decode {where}: an integer is too long ({e})") from None
    except RecursionError:
        raise errors.DecodeError(f"cannot decode {where}: nested too deeply") from None


def _untag(d: dict[str, Any]) -> object:
    """Rebuild the value a tagged JSON object stands for."""
    tag = d[_MARK]
    rebuild = _REBUILDERS.get(tag) if isinstance(tag, str) else None
    if rebuild is None:
        raise _Bad(f"unknown tag {tag!r}")
    try:
        return rebuild(d)
    except _Bad:
        raise
    except Exception as e:
        what = f"{tag} {d['class']!r}" if isinstance(d.get("class"), str) else f"a {tag}"
        raise _Bad(f"could not rebuild {what}: {type(e).__name__}: {e}") from e


def _get(d: dict[str, Any], key: str, kind: type[_T]) -> _T:
    value = d.get(key)
    if not isinstance(value, kind):
        raise _Bad(
            f"tag {d[_MARK]!r} needs {key!r} to be a {kind.__name__}, got {_REPR.repr(value)}"
        )
    return value


def _resolve(d: dict[str, Any], kind: str, ok: Callable[[Any], bool]) -> Any:
    """The class a tagged object names, found in ``sys.modules`` only and checked."""
    path = _get(d, "class", str)
    module_name, _, qualname = path.partition(":")
    if module_name not in sys.modules:
        raise _Bad(
            f"class {path!r} is not loaded in this process; import its module before resuming"
        )
    cls = _lookup(module_name, qualname)
    if cls is None:
        raise _Bad(f"class {path!r} is not defined: module {module_name!r} has no {qualname!r}")
    if not (isinstance(cls, type) and ok(cls)):
        raise _Bad(f"class {path!r} is not a {kind}; refusing to build it from storage")
    return cls


def _dataclass(d: dict[str, Any]) -> object:
    cls = _resolve(d, "dataclass", dataclasses.is_dataclass)
    fields = _get(d, "fields", dict)
    late = {f.name for f in dataclasses.fields(cls) if not f.init}
    obj = cls(**{k: v for k, v in fields.items() if k not in late})
    for name in late & fields.keys():
        object.__setattr__(obj, name, fields[name])
    return obj


def _pydantic(d: dict[str, Any]) -> object:
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
    cls = _resolve(d, "pydantic BaseModel", lambda c: base is not None and issubclass(c, base))
    return validate_model(cls, _get(d, "fields", dict))


def validate_model(cls: Any, fields: object) -> object:
    """``cls.model_validate(fields)``, reading the fields by name as ``model_dump`` wrote them.

    A field with an alias (``user_id`` with ``alias="userId"``) is otherwise accepted by
    its alias only, and the model could not be read back; pydantic before 2.11 has no
    ``by_name`` (nor a way to ask for it per call).
    """
    if _validates_by_name():
        return cls.model_validate(fields, by_name=True)
    return cls.model_validate(fields)


@functools.cache
def _validates_by_name() -> bool:
    """Whether this pydantic's ``model_validate`` takes ``by_name`` (2.11 on)."""
    base = sys.modules["pydantic"].BaseModel
    return "by_name" in inspect.signature(base.model_validate).parameters


def _path(d: dict[str, Any]) -> object:
    cls = _PATH_TYPES.get(_get(d, "kind", str))
    if cls is None:
        raise _Bad(f"unknown path kind {d['kind']!r}")
    return cls(_get(d, "path", str))


def _from_iso(d: dict[str, Any], cls: type[date | time]) -> object:
    value = cls.fromisoformat(_get(d, "iso", str))
    if "offset_us" in d:
        offset = timedelta(microseconds=_get(d, "offset_us", int))
        return value.replace(tzinfo=timezone(offset))  # type: ignore[call-arg]
    return value


def _bad_constant(name: str) -> object:
    raise _Bad(f"{name} is not valid JSON")


_REBUILDERS: dict[str, Callable[[dict[str, Any]], object]] = {
    "tuple": lambda d: tuple(_get(d, "items", list)),
    "int": lambda d: int(_get(d, "hex", str), 16),
    "set": lambda d: set(_get(d, "items", list)),
    "frozenset": lambda d: frozenset(_get(d, "items", list)),
    "dict": lambda d: dict(_get(d, "items", list)),
    "bytes": lambda d: base64.b64decode(_get(d, "b64", str), validate=True),
    "datetime": lambda d: _from_iso(d, datetime),
    "date": lambda d: _from_iso(d, date),
    "time": lambda d: _from_iso(d, time),
    "timedelta": lambda d: timedelta(**{k: _get(d, k, int) for k in _TIMEDELTA}),
    "decimal": lambda d: Decimal(_get(d, "value", str)),
    "uuid": lambda d: uuid.UUID(hex=_get(d, "hex", str)),
    "path": _path,
    "enum": lambda d: _resolve(d, "Enum", lambda c: issubclass(c, enum.Enum))(d.get("value")),
    "dataclass": _dataclass,
    "pydantic": _pydantic,
}
_read_plain = json_text.reader(json.JSONDecoder(parse_constant=_bad_constant))
_read_tagged = json_text.reader(
    json.JSONDecoder(
        parse_constant=_bad_constant, object_hook=lambda d: _untag(d) if _MARK in d else d
    )
)


# --- shapes: the data without its classes --------------------------------------------


def decode_shape(text: str, *, where: str) -> object:
    """The data ``text`` holds with its classes left out.

    A dataclass or pydantic model becomes the dict of its fields and an Enum
    member its value; every other tag is undone as :func:`decode` does. This is
    what a type the code declares today is built from when the class stored
    with a value was renamed or changed (see :mod:`durably.declared`).
    """
    try:
        return _SHAPE_DECODER.decode(text)
    except _Bad as e:
        raise errors.DecodeError(f"cannot decode {where}: {e}") from e.__cause__
    except (ValueError, RecursionError) as e:
        raise errors.DecodeError(f"cannot decode {where}: {e}") from None


def _unshape(d: dict[str, Any]) -> object:
    tag = d[_MARK]
    if tag in ("dataclass", "pydantic"):
        return _get(d, "fields", dict)
    if tag == "enum":
        return d.get("value")
    return _untag(d)


_SHAPE_DECODER = json.JSONDecoder(
    parse_constant=_bad_constant, object_hook=lambda d: _unshape(d) if _MARK in d else d
)
_SHOWN_FIELDS = 8


def describe_stored(text: str) -> str:
    """A short account of what a stored value is, for an error a person reads.

    ``pydantic 'app:Order' {id: int, total: float}``, ``list of 3 (dict {a: str})``,
    ``str``: the class path it was stored with, its field names and their kinds.
    """
    try:
        tree = _read_plain(text)
    except (ValueError, RecursionError, _Bad):
        return "corrupt JSON"
    return _describe(tree, 0)


def _describe(tree: object, depth: int) -> str:
    if isinstance(tree, list):
        if not tree or depth > 1:
            return f"list of {len(tree)}"
        return f"list of {len(tree)} ({_describe(tree[0], depth + 1)}, ...)"
    if not isinstance(tree, dict):
        return "null" if tree is None else type(tree).__name__
    tag = tree.get(_MARK)
    if tag in ("dataclass", "pydantic"):
        fields = tree.get("fields")
        shown = _field_kinds(fields) if isinstance(fields, dict) else "{?}"
        return f"{tag} {tree.get('class')!r} {shown}"
    if tag == "enum":
        return f"enum {tree.get('class')!r} value {_REPR.repr(tree.get('value'))}"
    if isinstance(tag, str):
        return tag
    return f"dict {_field_kinds(tree)}"


def _field_kinds(fields: dict[str, Any]) -> str:
    kinds = [f"{name}: {_kind(value)}" for name, value in list(fields.items())[:_SHOWN_FIELDS]]
    more = ", ..." if len(fields) > _SHOWN_FIELDS else ""
    return "{" + ", ".join(kinds) + more + "}"


def _kind(value: object) -> str:
    if isinstance(value, dict):
        tag = value.get(_MARK)
        if tag in ("dataclass", "pydantic", "enum"):
            return f"{tag} {value.get('class')!r}"
        return tag if isinstance(tag, str) else "dict"
    return "null" if value is None else type(value).__name__


# --- errors ------------------------------------------------------------------


def encode_error(exc: BaseException) -> dict[str, object]:
    """A JSON-safe record of ``exc``: type path, message, constructor args, traceback.

    Never raises: parts that cannot be captured become None or placeholder text.
    """
    t = type(exc)
    name = _storable(f"{t.__module__}.{t.__qualname__}")
    try:
        message = _storable(str(exc))
    except Exception:
        message = f"<unprintable {name}>"
    try:
        tb = _storable("".join(traceback.format_exception(exc)))
    except Exception:
        tb = ""
    args: object
    try:
        args = _to_json(list(_constructor_args(exc)))
    except Exception:
        args = None
    record: dict[str, object] = {"type": name, "message": message, "args": args, "traceback": tb}
    state = errorstate.capture(exc, _to_json)
    if state is not None:
        record["state"] = state
    return record


def _storable(text: str) -> str:
    """``text`` with what UTF-8 cannot hold (lone surrogates) as backslash escapes."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _constructor_args(exc: BaseException) -> tuple[object, ...]:
    """What ``type(exc)`` was called with, as ``__reduce__`` reports it (pickle's view)."""
    try:
        reduced = exc.__reduce__()
    except Exception:
        return exc.args
    match reduced:
        case (cls, tuple() as args, *_) if cls is type(exc):
            return args
    return exc.args


def decode_error(data: dict[str, object]) -> BaseException:
    """The exception ``encode_error`` recorded, rebuilt when its class is already loaded.

    Its recorded attributes are set back (see :mod:`durably.errorstate`), so a
    provider's error keeps its status, code and body. Falls back to StepError
    (type name, message, traceback) when the class is not in ``sys.modules``, is
    not an exception, or cannot be built.
    """
    type_name = data.get("type")
    type_name = type_name if isinstance(type_name, str) else "<unknown>"
    message = str(data.get("message", ""))
    tb = data.get("traceback")
    tb = tb if isinstance(tb, str) else ""
    cls = _exception_class(type_name)
    if cls is not None:
        attempts: list[tuple[object, ...]] = []
        try:
            # the tree holds JSON types only, so _write writes it verbatim
            args = _read_tagged(_write(data.get("args")))
            if isinstance(args, (list, tuple)):
                attempts.append(tuple(args))
        except Exception:
            pass
        attempts.append((message,))
        attrs = errorstate.restore(data.get("state"), _from_json_tree)
        exc = errorstate.rebuild(cls, attempts, attrs)
        if exc is not None:
            if tb:
                exc.add_note(f"[durably] recorded traceback:\n{tb.rstrip()}")
            return exc
    return errors.StepError(type_name, message, tb)


def _from_json_tree(tree: object) -> object:
    """The values a JSON tree written by ``_to_json`` stands for (tags undone)."""
    return _read_tagged(_write(tree))


def _exception_class(type_name: str) -> type[Exception] | None:
    """The exception class named ``module.QualName``, from loaded modules only.

    Only an ``Exception`` subclass that is not one of durably's own control-flow
    signals is rebuilt: raising a stored SystemExit, KeyboardInterrupt,
    CancelledError, a private class of durably's or a FencedError into workflow
    code would steer the engine, not report a step's failure.
    """
    parts = type_name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        if module_name in sys.modules:
            qualname = ".".join(parts[i:])
            cls = _lookup(module_name, qualname)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                continue
            if issubclass(cls, errors.FencedError):
                return None
            ours = module_name == "durably" or module_name.startswith("durably.")
            if ours and any(part.startswith("_") for part in qualname.split(".")):
                return None
            return cls
    return None
