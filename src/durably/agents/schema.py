"""A tool's JSON schema and argument validation, from its type hints and docstring.

The model sees a function's name, a description (the first paragraph of the
docstring) and a JSON schema of its parameters, each described by the
docstring's ``Args:`` section (Google style; ``:param x:`` works too). When
pydantic is importable the schema and the validation are pydantic's own (so
pydantic models, dataclasses, ``Literal``, ``Optional``, ``Annotated`` and
defaults all behave as pydantic users expect); otherwise a small mapper covers
str, int, float, bool, list, tuple, dict, Optional/Union, Literal, Enum and
dataclasses.

Everything here is decided at decoration time: a hint that cannot become a
schema is a DefinitionError when the module is imported, not at 3 a.m. when the
model first calls the tool.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import inspect
import json
import re
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from durably import errors

JSON = dict[str, Any]
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Kwargs|Returns|Return|Yields|Raises|"
    r"Examples?|Notes?|Warnings?|See Also|Attributes|Todo):\s*$"
)
_ARG_SECTIONS = {"Args", "Arguments", "Parameters", "Params", "Keyword Args", "Kwargs"}
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_SPHINX = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")


class InvalidArguments(ValueError):
    """The model's arguments do not fit the tool's schema (the message says how)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Docstring:
    """What a docstring tells the model: a description and one line per parameter."""

    description: str
    params: dict[str, str]


def parse_docstring(doc: str | None) -> Docstring:
    """The first paragraph (joined into one line) and the parameter entries of ``doc``."""
    lines = inspect.cleandoc(doc or "").splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line) or _SPHINX.match(line):
            break
        first.append(line.strip())
    params = _google_params(lines)
    params.update(_sphinx_params(lines))
    return Docstring(" ".join(first), params)


def _google_params(lines: list[str]) -> dict[str, str]:
    """Entries of ``Args:`` sections: ``name (type): text``, continued on deeper lines."""
    params: dict[str, str] = {}
    in_args, entry_indent, current = False, -1, ""
    for line in lines:
        text = line.strip()
        indent = len(line) - len(line.lstrip())
        if text and indent == 0:
            header = _SECTION.match(text)
            in_args = header is not None and header.group(1) in _ARG_SECTIONS
            entry_indent, current = -1, ""
            continue
        if not in_args or not text:
            continue
        if entry_indent < 0:
            entry_indent = indent
        match = _ARG_LINE.match(text)
        if indent <= entry_indent and match:
            current = match.group(1)
            params[current] = match.group(3).strip()
        elif current:
            params[current] = f"{params[current]} {text}".strip()
    return params


def _sphinx_params(lines: list[str]) -> dict[str, str]:
    """``:param name: text`` entries, continued on indented lines."""
    params: dict[str, str] = {}
    current = ""
    for line in lines:
        text = line.strip()
        match = _SPHINX.match(text)
        if match:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current and text and line[:1].isspace() and not text.startswith(":"):
            params[current] = f"{params[current]} {text}".strip()
        else:
            current = ""
    return params


# --- signatures ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Signature:
    """A function as the model sees it, and how to check what the model sends."""

    name: str
    description: str
    parameters: JSON
    names: tuple[str, ...]
    _validate: Callable[[Mapping[str, Any]], tuple[dict[str, Any], JSON]]

    def validate(self, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], JSON]:
        """The keyword arguments to call with, and the same as JSON (defaults filled in).

        Raises InvalidArguments with a message meant for the model.
        """
        if not isinstance(arguments, Mapping):
            raise InvalidArguments(f"arguments must be a JSON object, got {arguments!r}")
        return self._validate(arguments)

    def definition(self, *, strict: bool = False) -> JSON:
        """The entry for the ``tools`` list of a chat completions request.

        ``strict=True`` closes the parameters' objects and marks the function
        strict (the provider then guarantees arguments that fit), when every
        parameter is required; a tool with optional parameters stays as it is.
        """
        function: JSON = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        if strict:
            from durably.agents import output

            closed = output.strict_schema(self.parameters)
            if closed is not None:
                function["parameters"] = closed
                function["strict"] = True
        return {"type": "function", "function": function}


def signature(
    fn: Callable[..., Any],
    *,
    name: str,
    description: str | None = None,
    use_pydantic: bool | None = None,
) -> Signature:
    """Read ``fn``'s parameters, hints and docstring; DefinitionError if they cannot be a tool."""
    doc = parse_docstring(inspect.getdoc(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise errors.DefinitionError(f"cannot read the type hints of {name!r}: {exc}") from exc
    params: list[tuple[str, Any, Any]] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise errors.DefinitionError(
                f"tool {name!r}: parameter {p.name!r} is {p.kind.description}; "
                "a tool takes named parameters only (the model sends a JSON object)"
            )
        params.append((p.name, hints.get(p.name, Any), p.default))
    if use_pydantic is None:
        use_pydantic = importlib.util.find_spec("pydantic") is not None
    build = _pydantic_signature if use_pydantic else _plain_signature
    schema, validate = build(name, params, doc.params)
    return Signature(
        name,
        doc.description if description is None else description,
        schema,
        tuple(p[0] for p in params),
        validate,
    )


Params = Sequence[tuple[str, Any, Any]]
Built = tuple[JSON, Callable[[Mapping[str, Any]], tuple[dict[str, Any], JSON]]]


def _pydantic_signature(name: str, params: Params, described: Mapping[str, str]) -> Built:
    import pydantic
    import pydantic.json_schema

    fields: dict[str, Any] = {}
    for i, (pname, hint, default) in enumerate(params):
        value = ... if default is inspect.Parameter.empty else default
        # an alias keeps names like "json" or "model_id" clear of BaseModel's own attributes
        field = pydantic.Field(value, alias=pname, description=described.get(pname))
        fields[f"p{i}"] = (hint, field)
    config = pydantic.ConfigDict(extra="forbid", protected_namespaces=())
    try:
        model = pydantic.create_model(f"{name}_arguments", __config__=config, **fields)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pydantic.json_schema.PydanticJsonSchemaWarning)
            schema = _strip_titles(model.model_json_schema(by_alias=True))
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as exc:
        raise errors.DefinitionError(f"tool {name!r}: {exc}") from exc
    names = [p[0] for p in params]

    def validate(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], JSON]:
        try:
            parsed = model.model_validate(dict(arguments))
        except pydantic.ValidationError as exc:
            raise InvalidArguments(_pydantic_message(exc)) from None
        kwargs = {pname: getattr(parsed, f"p{i}") for i, pname in enumerate(names)}
        return kwargs, parsed.model_dump(mode="json", by_alias=True)

    return schema, validate


def _pydantic_message(exc: Any) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(x) for x in err.get("loc", ())) or "arguments"
        parts.append(f"{where}: {err.get('msg')}")
    return "invalid arguments: " + "; ".join(parts)


_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not")


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` keywords (noise in a prompt), keeping property names."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    for key in ("properties", "$defs"):
        if isinstance(out.get(key), dict):
            out[key] = {n: _strip_titles(s) for n, s in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_strip_titles(s) for s in out[key]]
    for key in _SCHEMA_VALUES:
        if isinstance(out.get(key), dict):
            out[key] = _strip_titles(out[key])
    return out


# --- without pydantic -------------------------------------------------------------------

_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _plain_signature(name: str, params: Params, described: Mapping[str, str]) -> Built:
    properties: JSON = {}
    required: list[str] = []
    for pname, hint, default in params:
        try:
            prop = hint_schema(hint)
        except errors.DefinitionError as exc:
            raise errors.DefinitionError(f"tool {name!r}, parameter {pname!r}: {exc}") from None
        if pname in described:
            prop["description"] = described[pname]
        if default is inspect.Parameter.empty:
            required.append(pname)
        elif _is_json(to_json(default)):
            prop["default"] = to_json(default)
        properties[pname] = prop
    schema: JSON = {"additionalProperties": False, "properties": properties, "type": "object"}
    if required:
        schema["required"] = required

    def validate(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], JSON]:
        extra = sorted(set(arguments) - {p[0] for p in params})
        if extra:
            raise InvalidArguments(f"invalid arguments: {', '.join(extra)}: unexpected")
        kwargs: dict[str, Any] = {}
        for pname, hint, default in params:
            if pname in arguments:
                kwargs[pname] = coerce(hint, arguments[pname], pname)
            elif default is inspect.Parameter.empty:
                raise InvalidArguments(f"invalid arguments: {pname}: field required")
            else:
                kwargs[pname] = default
        return kwargs, {k: to_json(v) for k, v in kwargs.items()}

    return schema, validate


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _unwrap(hint: Any) -> Any:
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def hint_schema(hint: Any) -> JSON:
    """The JSON schema of one type hint (the subset the fallback mapper knows)."""
    hint = _unwrap(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if hint in _PRIMITIVES:
        return {"type": _PRIMITIVES[hint]}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [hint_schema(a) for a in args]}
    if origin is typing.Literal:
        out: JSON = {"enum": list(args)}
        kinds = {_PRIMITIVES.get(type(a)) for a in args}
        if len(kinds) == 1 and None not in kinds:
            out["type"] = kinds.pop()
        return out
    if hint in (list, tuple, set, frozenset) or origin in (list, set, frozenset, Sequence):
        return {"items": hint_schema(args[0]) if args else {}, "type": "array"}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"items": hint_schema(args[0]), "type": "array"}
        n = len(args)
        items = [hint_schema(a) for a in args]
        return {"maxItems": n, "minItems": n, "prefixItems": items, "type": "array"}
    if hint is dict or origin in (dict, Mapping):
        value = hint_schema(args[1]) if len(args) == 2 else {}
        return {"additionalProperties": value or True, "type": "object"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        out = {"enum": values}
        kinds = {_PRIMITIVES.get(type(v)) for v in values}
        if len(kinds) == 1 and None not in kinds:
            out["type"] = kinds.pop()
        return out
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_schema(hint)
    raise errors.DefinitionError(
        f"the type {hint!r} has no JSON schema here (install pydantic for the full set)"
    )


def _dataclass_schema(cls: type) -> JSON:
    hints = typing.get_type_hints(cls, include_extras=True)
    properties: JSON = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        prop = hint_schema(hints.get(f.name, Any))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        elif f.default is not dataclasses.MISSING and _is_json(f.default):
            prop["default"] = f.default
        properties[f.name] = prop
    out: JSON = {"properties": properties, "type": "object"}
    if required:
        out["required"] = required
    return out


def coerce(hint: Any, value: Any, where: str) -> Any:
    """``value`` (decoded JSON) as the Python value ``hint`` asks for; InvalidArguments if not."""
    hint = _unwrap(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)

    def bad(expected: str) -> InvalidArguments:
        return InvalidArguments(f"invalid arguments: {where}: expected {expected}, got {value!r}")

    if hint is Any or hint is object:
        return value
    if hint is None or hint is type(None):
        if value is not None:
            raise bad("null")
        return None
    if hint is bool:
        if not isinstance(value, bool):
            raise bad("a boolean")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return coerce(option, value, where)
            except InvalidArguments:
                continue
        raise bad(" or ".join(map(_hint_name, args)))
    if origin is typing.Literal:
        if value not in args:
            raise bad(" or ".join(map(repr, args)))
        return value
    if hint in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset, Sequence):
        if not isinstance(value, list):
            raise bad("an array")
        items = [coerce(_item_hint(args, i), v, f"{where}.{i}") for i, v in enumerate(value)]
        kind = origin or hint
        return tuple(items) if kind is tuple else kind(items) if kind in (set, frozenset) else items
    if hint is dict or origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise bad("an object")
        item = args[1] if len(args) == 2 else Any
        return {k: coerce(item, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise bad(" or ".join(repr(m.value) for m in hint)) from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise bad("an object")
        hints = typing.get_type_hints(hint, include_extras=True)
        names = {f.name for f in dataclasses.fields(hint)}
        extra = sorted(set(value) - names)
        if extra:
            raise InvalidArguments(f"invalid arguments: {where}.{', '.join(extra)}: unexpected")
        fields = {k: coerce(hints.get(k, Any), v, f"{where}.{k}") for k, v in value.items()}
        try:
            return hint(**fields)
        except TypeError as exc:
            raise InvalidArguments(f"invalid arguments: {where}: {exc}") from None
    return value


def _item_hint(args: tuple[Any, ...], i: int) -> Any:
    if not args:
        return Any
    if len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return args[i] if i < len(args) else Any


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or repr(hint)


def to_json(value: Any) -> Any:
    """A validated value as plain JSON data (dataclasses as objects, enums as their values)."""
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value
