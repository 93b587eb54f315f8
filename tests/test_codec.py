"""Tests for durably.codec: exact round-trips, clear errors, no code run from storage."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import socket
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum, Flag, IntEnum, StrEnum
from typing import NamedTuple
from zoneinfo import ZoneInfo

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durably import codec, errors

# --- test-only payload types (module level so decode can find them) ----------


class Color(Enum):
    RED = "red"
    PAIR = (1, 2)


class Priority(IntEnum):
    LOW = 1
    HIGH = 2


class Mode(StrEnum):
    FAST = "fast"


class Perm(Flag):
    R = 1
    W = 2


@dataclass
class Item:
    sku: str
    qty: int


@dataclass
class Refund:
    refund_id: str
    amount: Decimal
    items: list[Item]
    when: datetime
    tags: tuple[str, ...] = ()
    meta: dict[object, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Point:
    x: int
    y: int


@dataclass
class WithLate:
    a: int
    b: int = field(init=False, default=0)


@dataclass
class Tricky:
    __durably__: object  # a field named like the tag key


class Outer:
    @dataclass
    class Inner:
        v: tuple[int, int]


class Line(pydantic.BaseModel):
    sku: str
    qty: int


class Order(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    order_id: int
    when: datetime
    lines: list[Line]
    pair: tuple[int, str]
    color: Color
    note: str | None = None

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def line_count(self) -> int:
        return len(self.lines)


class Account(pydantic.BaseModel):
    """A model whose fields have aliases (a camelCase API's): only the alias is accepted as
    input, while ``model_dump`` writes the field names."""

    user_id: str = pydantic.Field(alias="userId")
    plan: Line = pydantic.Field(validation_alias="planSku", serialization_alias="plan")


class Pair(NamedTuple):
    a: int
    b: int


class Name(str):
    pass


class Opaque:
    pass


class RefundDeclined(Exception):
    pass


class TwoArgs(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class MessageOnly(Exception):
    def __init__(self, order_id: int, amount: int) -> None:
        super().__init__(f"order {order_id} over limit by {amount}")

    def __reduce__(self) -> str | tuple[object, ...]:
        return (str, ("not the constructor",))


# --- helpers -------------------------------------------------------------------


def assert_same(a: object, b: object) -> None:
    """Equal and of the same type all the way down (1, 1.0 and True differ here)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert isinstance(b, dict)
        assert len(a) == len(b)
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert_same(ka, kb)
            assert_same(va, vb)
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, set | frozenset):
        assert a == b
        assert sorted(map(repr, a)) == sorted(map(repr, b))
    elif isinstance(a, float | Decimal):
        assert repr(a) == repr(b)
    elif isinstance(a, datetime | time):
        assert a == b
        assert a.utcoffset() == b.utcoffset()  # type: ignore[attr-defined]
    else:
        assert a == b


def roundtrip(value: object) -> object:
    text = codec.encode(value, where="test value")
    json.loads(text)  # always valid JSON
    back = codec.decode(text, where="test value")
    assert_same(value, back)
    return back


UTC5 = timezone(timedelta(hours=5, minutes=30))

SIMPLE_VALUES = [
    None,
    True,
    False,
    0,
    -7,
    2**80,
    1.5,
    -0.0,
    "",
    "héllo ✓",
    [],
    {},
    [1, "a", None],
    {"a": 1, "b": [True, None]},
    (),
    (1,),
    (1, (2, (3, "x"))),
    [(1, 2), [3, (4,)]],
    {1, 2, 3},
    frozenset({"a", "b"}),
    {(1, 2), (3, 4)},
    set(),
    b"",
    b"\x00\xffbytes",
    datetime(2024, 5, 1, 12, 30, 45, 123456),
    datetime(2024, 5, 1, 12, 30, 45, 7, tzinfo=UTC),
    datetime(2024, 5, 1, 12, 30, tzinfo=UTC5),
    datetime(2000, 1, 1, tzinfo=timezone(timedelta(microseconds=-1))),
    time(0, 0, tzinfo=timezone(timedelta(microseconds=999999))),
    date(2024, 2, 29),
    time(23, 59, 59, 999999),
    time(1, 2, tzinfo=UTC5),
    timedelta(days=-3, seconds=5, microseconds=7),
    Decimal("1.10"),
    Decimal("-0"),
    Decimal("1E+3"),
    Decimal("Infinity"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    Color.RED,
    Color.PAIR,
    Priority.HIGH,
    Mode.FAST,
    Perm.R | Perm.W,
    Item("a", 1),
    Point(1, 2),
    Outer.Inner((1, 2)),
    Tricky(5),
    Tricky((1, {"__durably__": (2,)})),
    pathlib.PurePosixPath("/a/b"),
    pathlib.PureWindowsPath(r"C:\x\y"),
    pathlib.Path("rel/p"),
    {1: "int key", "1": "str key"},
    {(1, "a"): [1], (2, "b"): [2]},
    {True: 1, None: 2, 1.5: 3},
    {Color.RED: 1, Point(0, 0): 2},
    {"__durably__": "tuple", "items": [1, 2]},
    {"outer": {"__durably__": {"__durably__": 1}}},
    ["__durably__", {"k": "__durably__"}],
]


# --- round-trips -------------------------------------------------------------------


def _stable_id(value: object) -> str:
    """A value's repr as its test id, a set's members sorted: the id must not depend on
    the process's hash seed (each pytest-xdist worker has its own, and the workers must
    collect the same ids)."""
    if isinstance(value, set | frozenset):
        members = ", ".join(sorted(repr(v) for v in value))
        return f"{type(value).__name__}({{{members}}})"
    return repr(value)


@pytest.mark.parametrize("value", SIMPLE_VALUES, ids=_stable_id)
def test_roundtrip(value: object) -> None:
    roundtrip(value)


def test_plain_json_is_written_as_plain_compact_json() -> None:
    value = {"a": [1, 2.5, None, True], "b": {"c": "ü"}}
    text = codec.encode(value, where="x")
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_nested_combination() -> None:
    refund = Refund(
        refund_id="r-1",
        amount=Decimal("12.30"),
        items=[Item("a", 1), Item("b", 2)],
        when=datetime(2024, 1, 1, 9, tzinfo=UTC5),
        tags=("vip", "late"),
        meta={1: (b"x", {frozenset({1})}), "__durably__": None},
    )
    roundtrip({"refund": refund, "history": [(refund, Color.RED)], 7: {Point(1, 2)}})


def test_aware_datetime_keeps_offset_as_fixed_offset() -> None:
    value = datetime(2024, 7, 1, 12, tzinfo=ZoneInfo("Europe/Paris"))
    back = codec.decode(codec.encode(value, where="x"), where="x")
    assert isinstance(back, datetime)
    assert back == value
    assert back.utcoffset() == timedelta(hours=2)


def test_dataclass_init_false_field_is_restored() -> None:
    value = WithLate(1)
    value.b = 9
    back = codec.decode(codec.encode(value, where="x"), where="x")
    assert isinstance(back, WithLate)
    assert (back.a, back.b) == (1, 9)


def test_frozen_dataclass_roundtrips_and_stays_frozen() -> None:
    back = roundtrip(Point(3, 4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.x = 1  # type: ignore[attr-defined]


def test_pydantic_model_roundtrips() -> None:
    order = Order(
        order_id=1,
        when=datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        lines=[Line(sku="a", qty=2)],
        pair=(1, "x"),
        color=Color.PAIR,
    )
    back = roundtrip({"order": order})
    assert isinstance(back, dict)
    assert type(back["order"].lines[0]) is Line
    assert type(back["order"].pair) is tuple


def test_a_pydantic_model_with_aliased_fields_roundtrips() -> None:
    """The fields are stored by name, so they are read back by name: validating them by
    alias failed, and a step returning such a model could not be decoded, even fresh."""
    back = roundtrip(Account(userId="u1", planSku=Line(sku="pro", qty=1)))
    assert isinstance(back, Account)
    assert back.user_id == "u1"
    assert back.plan == Line(sku="pro", qty=1)


def test_set_text_does_not_depend_on_insertion_order() -> None:
    a = codec.encode({"b", "a", "c"}, where="x")
    b = codec.encode({"c", "a", "b"}, where="x")
    assert a == b


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
offsets = st.timedeltas(
    min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23, minutes=59)
)
leaves = (
    json_leaves
    | st.binary(max_size=20)
    | st.decimals(allow_nan=False)
    | st.datetimes(timezones=st.none() | st.builds(timezone, offsets))
    | st.dates()
    | st.timedeltas()
    | st.uuids()
)
keys = st.text() | st.just("__durably__") | st.integers() | st.tuples(st.integers(), st.text())


def _containers(children: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=5), children, max_size=4)
        | st.dictionaries(keys, children, max_size=4)
        | st.frozensets(st.integers() | st.text(), max_size=4)
    )


@settings(max_examples=300, deadline=None)
@given(st.recursive(leaves, _containers, max_leaves=20))
def test_property_roundtrip(value: object) -> None:
    roundtrip(value)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        json_leaves,
        lambda c: st.lists(c) | st.dictionaries(st.text().filter(lambda k: k != "__durably__"), c),
    )
)
def test_property_plain_json_matches_json_dumps(value: object) -> None:
    text = codec.encode(value, where="x")
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert_same(value, codec.decode(text, where="x"))


# --- encode errors -----------------------------------------------------------------


def test_encode_error_names_where_type_and_path() -> None:
    with pytest.raises(errors.EncodeError) as info:
        codec.encode({"items": [1, 2, Opaque()]}, where="step 'issue_refund' result")
    msg = str(info.value)
    assert "step 'issue_refund' result" in msg
    assert f"{Opaque.__module__}.Opaque" in msg
    assert "result['items'][2]" in msg
    assert isinstance(info.value, TypeError)


def test_encode_error_path_through_dataclass_and_tuple() -> None:
    value = Refund("r", Decimal(1), [Item("a", 1)], datetime(2024, 1, 1), meta={"k": (1, Opaque())})
    with pytest.raises(errors.EncodeError, match=r"output\.meta\['k'\]\[1\] is a "):
        codec.encode(value, where="workflow 'w' output")


def test_encode_error_root_falls_back_to_value() -> None:
    with pytest.raises(errors.EncodeError, match=r"value\[0\] is a "):
        codec.encode([Opaque()], where="the 'x' thing!")


def _gen() -> object:
    yield 1


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (float("nan"), "NaN or infinity"),
        ({"x": [float("inf")]}, "result['x'][0] is the float inf"),
        (lambda: 1, "is a function"),
        (_gen(), "is a generator"),
        (Opaque, "is the class"),
        (Pair(1, 2), "subclass of tuple"),
        ({"n": Name("x")}, "subclass of str"),
        (bytearray(b"x"), "is a bytearray"),
        ({"k": {Opaque(): 1}}, "result['k']"),
    ],
)
def test_unencodable_values(value: object, fragment: str) -> None:
    with pytest.raises(errors.EncodeError) as info:
        codec.encode(value, where="step 's' result")
    assert fragment in str(info.value)


def test_socket_is_unencodable() -> None:
    with socket.socket() as sock, pytest.raises(errors.EncodeError, match="socket"):
        codec.encode({"conn": sock}, where="step 's' result")


def test_class_defined_in_function_is_rejected_at_encode() -> None:
    @dataclass
    class Local:
        x: int

    with pytest.raises(errors.EncodeError, match="define it at module level"):
        codec.encode(Local(1), where="step 's' result")


def test_reference_cycle_is_rejected() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(errors.EncodeError, match="reference cycle"):
        codec.encode(loop, where="x")


# --- decode errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"a": ', "corrupt JSON"),
        ("[NaN]", "NaN is not valid JSON"),
        ('{"__durably__": "nope"}', "unknown tag 'nope'"),
        ('{"__durably__": "tuple"}', "'items'"),
        ('{"__durably__": "bytes", "b64": "!!"}', "could not rebuild"),
        ('{"__durably__": "decimal", "value": "abc"}', "could not rebuild"),
        ('{"__durably__": "path", "kind": "Evil", "path": "x"}', "unknown path kind"),
    ],
)
def test_decode_errors(text: str, fragment: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        codec.decode(text, where="step 's' result")
    assert "step 's' result" in str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_decode_unloaded_class_names_it_and_imports_nothing() -> None:
    assert "this" not in sys.modules
    text = '{"__durably__":"dataclass","class":"this:Refund","fields":{}}'
    with pytest.raises(errors.DecodeError) as info:
        codec.decode(text, where="step 'issue_refund' result")
    assert "class 'this:Refund' is not loaded in this process" in str(info.value)
    assert "this" not in sys.modules


@pytest.mark.parametrize(
    ("tag", "path", "fragment"),
    [
        ("dataclass", "builtins:dict", "is not a dataclass"),
        ("enum", "os:system", "is not a Enum"),
        ("pydantic", f"{__name__}:Item", "is not a pydantic BaseModel"),
        ("dataclass", f"{__name__}:Missing", "has no 'Missing'"),
        ("dataclass", f"{__name__}:Item", "could not rebuild dataclass"),
    ],
)
def test_decode_refuses_wrong_kind_of_class(tag: str, path: str, fragment: str) -> None:
    payload = {"__durably__": tag, "class": path, "fields": {"bogus": 1}, "value": "ls"}
    with pytest.raises(errors.DecodeError, match=fragment):
        codec.decode(json.dumps(payload), where="x")


# --- errors ------------------------------------------------------------------------


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _through_storage(data: dict[str, object]) -> dict[str, object]:
    back = json.loads(json.dumps(data))
    assert back == data  # JSON-safe as is
    return back  # type: ignore[no-any-return]


def test_value_error_roundtrips() -> None:
    data = _through_storage(codec.encode_error(_raised(ValueError("bad amount"))))
    assert data["type"] == "builtins.ValueError"
    assert data["message"] == "bad amount"
    assert "Traceback" in str(data["traceback"])
    exc = codec.decode_error(data)
    assert type(exc) is ValueError
    assert str(exc) == "bad amount"
    assert any("bad amount" in note for note in exc.__notes__)


def test_custom_exception_roundtrips() -> None:
    exc = codec.decode_error(_through_storage(codec.encode_error(RefundDeclined("expired"))))
    assert type(exc) is RefundDeclined
    assert exc.args == ("expired",)


def test_two_arg_exception_roundtrips() -> None:
    exc = codec.decode_error(_through_storage(codec.encode_error(TwoArgs(402, "declined"))))
    assert isinstance(exc, TwoArgs)
    assert (exc.code, exc.reason) == (402, "declined")


def test_tagged_args_roundtrip() -> None:
    exc = codec.decode_error(_through_storage(codec.encode_error(KeyError((1, "k")))))
    assert type(exc) is KeyError
    assert exc.args == ((1, "k"),)


def test_unknown_exception_class_becomes_step_error() -> None:
    data = codec.encode_error(_raised(RefundDeclined("expired")))
    data["type"] = "gone_module.GoneError"
    exc = codec.decode_error(data)
    assert isinstance(exc, errors.StepError)
    assert exc.type_name == "gone_module.GoneError"
    assert exc.message == "expired"
    assert "RefundDeclined: expired" in exc.traceback_text


def test_non_exception_class_becomes_step_error() -> None:
    data: dict[str, object] = {"type": "os.system", "message": "ls", "args": ["ls"]}
    exc = codec.decode_error(data)
    assert isinstance(exc, errors.StepError)


def test_unbuildable_exception_becomes_step_error() -> None:
    data = codec.encode_error(MessageOnly(7, 100))
    exc = codec.decode_error(data)
    assert isinstance(exc, errors.StepError)
    assert exc.type_name.endswith(".MessageOnly")
    assert exc.message == "order 7 over limit by 100"


def test_unencodable_args_fall_back_to_message() -> None:
    data = codec.encode_error(RefundDeclined(Opaque()))
    assert data["args"] is None
    exc = codec.decode_error(data)
    assert type(exc) is RefundDeclined
    assert exc.args == (data["message"],)


def test_durably_error_with_constructor_args_roundtrips() -> None:
    original = errors.NonDeterminismError("wf-1", 3, "step 'a'", None)
    exc = codec.decode_error(_through_storage(codec.encode_error(original)))
    assert isinstance(exc, errors.NonDeterminismError)
    assert (exc.workflow_id, exc.seq, exc.recorded, exc.asked) == ("wf-1", 3, "step 'a'", None)


def test_error_record_survives_encode() -> None:
    data = codec.encode_error(KeyError((1, "k")))
    assert codec.decode(codec.encode(data, where="x"), where="x") == data


# --- text that is not UTF-8, long ints, control-flow exceptions (issue 15 items 3, 6) ------

LATIN1 = b"caf\xe9.txt".decode("utf-8", "surrogateescape")  # as os.listdir gives it


@dataclass
class Listing:
    names: tuple[str, ...]


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (LATIN1, "result is the string"),
        ({"files": ["a", "b", "c", LATIN1]}, "result['files'][3] is the string"),
        ({"files": {"a": 1, LATIN1: 2}}, "result['files'] has the key"),
        ({"k": (1, LATIN1)}, "result['k'][1] is the string"),
        ({"k": Listing(("a", LATIN1))}, "result['k'].names[1] is the string"),
        ({"k": {1: LATIN1}}, "result['k'][1] is the string"),
        ({"k": {LATIN1}}, "result['k']{"),
        ([pathlib.PurePosixPath("/tmp") / LATIN1], "result[0] is the string"),
        (["\ud83d\ude00"], "result[0] is the string"),  # a pair of surrogates is not UTF-8 either
    ],
    ids=["str", "list", "key", "tuple", "dataclass", "pairs", "set", "path", "pair"],
)
def test_text_that_is_not_utf8_is_refused_with_its_path(value: object, path: str) -> None:
    with pytest.raises(errors.EncodeError) as info:
        codec.encode(value, where="step 'list' result")
    msg = str(info.value)
    assert path in msg, msg
    assert "not valid UTF-8" in msg and "lone surrogate" in msg, msg
    msg.encode("utf-8")  # the message itself can be stored


def test_valid_non_ascii_text_still_roundtrips_on_the_fast_path() -> None:
    value = {"name": "café ☕ 😀", "ключ": ["ü"]}
    text = codec.encode(value, where="x")
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert codec.decode(text, where="x") == value


@pytest.mark.parametrize(
    "n",
    [10**5000, -(10**5000) + 7, 2**14001, 3**9000],
    ids=["1e5000", "-1e5000", "2^14001", "3^9000"],
)
def test_ints_beyond_the_digit_limit_roundtrip(n: int) -> None:
    for value in (n, {"n": [n]}, (n,)):
        assert codec.decode(codec.encode(value, where="x"), where="x") == value


def test_a_stored_int_beyond_the_digit_limit_is_a_decode_error() -> None:
    with pytest.raises(errors.DecodeError) as info:
        codec.decode('{"n": [' + "7" * 5000 + "]}", where="step 's' result")
    assert "step 's' result" in str(info.value)
    assert "too long" in str(info.value)


def test_an_error_message_with_a_lone_surrogate_is_recorded_escaped() -> None:
    data = codec.encode_error(_raised(ValueError(f"cannot open {LATIN1}")))
    text = codec.encode(data, where="step error")
    text.encode("utf-8")
    back = codec.decode(text, where="step error")
    assert isinstance(back, dict)
    assert back["message"] == "cannot open caf\\udce9.txt"
    assert "caf\\udce9.txt" in back["traceback"]
    exc = codec.decode_error(back)
    assert type(exc) is ValueError
    assert str(exc) == "cannot open caf\\udce9.txt"


@pytest.mark.parametrize(
    "exc_type",
    [
        "builtins.SystemExit",
        "builtins.KeyboardInterrupt",
        "builtins.GeneratorExit",
        "asyncio.exceptions.CancelledError",
        "durably.run_types.Suspended",
        "durably.run_types.Abandoned",
        "durably.errors.FencedError",
        "durably.codec._Fail",
    ],
)
def test_control_flow_exceptions_are_not_rebuilt_from_storage(exc_type: str) -> None:
    import asyncio  # noqa: F401  (loaded, so only the rule can refuse it)

    import durably.run_types  # noqa: F401

    data: dict[str, object] = {"type": exc_type, "message": "stop", "args": ["stop"]}
    exc = codec.decode_error(data)
    assert isinstance(exc, errors.StepError)
    assert exc.type_name == exc_type
    assert exc.message == "stop"


def test_public_durably_errors_are_still_rebuilt() -> None:
    data = codec.encode_error(errors.InvalidName("bad name"))
    exc = codec.decode_error(data)
    assert type(exc) is errors.InvalidName


# --- json_text: json's C parts built once, its text and errors unchanged -------------------


def test_json_text_writes_what_json_writes_and_reads_what_json_reads() -> None:
    import json

    from durably import json_text

    plain = json.JSONEncoder(
        separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
    )
    write = json_text.writer(lambda v: str(v))
    values = ["é", "", [1, 2.5, None, True], {"a": {"b": ["ü", -0.0]}}, 10**30, (1, 2)]
    for value in values:
        assert write(value) == plain.encode(value)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            write([bad])
    read = json_text.reader(json.JSONDecoder())
    for text in ('{"a":[1,2]}', " 1", "1 ", '"x"', "[]"):
        assert read(text) == json.loads(text)
    for text in ("", "[1,", '{"a":1}x', "nan"):
        with pytest.raises(json.JSONDecodeError) as ours:
            read(text)
        with pytest.raises(json.JSONDecodeError) as theirs:
            json.loads(text)
        assert str(ours.value) == str(theirs.value)
