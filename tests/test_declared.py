"""Recorded values decoded into the type the code declares today (durably.declared).

Each test stores a value the way a step's receipt is stored (codec.encode), then
changes the code as a deploy would: the class is renamed, gains a required
field, or moves; and decodes the stored text with the annotation of today's
step. No database: the workflow-level behaviour (diverged, resume) is in
tests/test_decode_deploys.py.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from collections.abc import Iterator
from typing import Any, Optional, TypedDict

import pydantic
import pytest

from durably import codec, declared, errors

APP = "tests_declared_app"


@pytest.fixture
def app() -> Iterator[types.ModuleType]:
    """A module ``tests_declared_app`` that a test fills with classes and changes."""
    module = types.ModuleType(APP)
    sys.modules[APP] = module
    try:
        yield module
    finally:
        del sys.modules[APP]


def _define(module: types.ModuleType, cls: type, name: str) -> type:
    """Put ``cls`` into ``module`` under ``name``, as if it were written there."""
    cls.__module__ = module.__name__
    cls.__name__ = cls.__qualname__ = name
    setattr(module, name, cls)
    return cls


def _stored(module: types.ModuleType, value: object) -> str:
    return codec.encode(value, where="test value")


def _returns(hint: Any) -> Any:
    def step() -> None: ...

    step.__annotations__ = {"return": hint}
    return declared.declared_result(step)


def test_a_renamed_pydantic_class_decodes_through_the_annotation(app: types.ModuleType) -> None:
    class Order(pydantic.BaseModel):
        id: str
        total: float

    _define(app, Order, "Order")
    text = _stored(app, Order(id="A1", total=12.5))
    del app.Order

    class PurchaseOrder(pydantic.BaseModel):
        id: str
        total: float

    _define(app, PurchaseOrder, "PurchaseOrder")
    with pytest.raises(errors.DecodeError, match="'tests_declared_app:Order' is not defined"):
        codec.decode(text, where="x")  # what failed before: the class path alone
    value = declared.decode_result(text, _returns(PurchaseOrder), where="step 'x' result")
    assert value == PurchaseOrder(id="A1", total=12.5)


def test_a_new_required_field_is_an_error_naming_the_shape_and_the_type(
    app: types.ModuleType,
) -> None:
    class Order(pydantic.BaseModel):
        id: str
        total: float

    _define(app, Order, "Order")
    text = _stored(app, Order(id="A1", total=12.5))

    class Order2(pydantic.BaseModel):
        id: str
        total: float
        currency: str

    _define(app, Order2, "Order")
    with pytest.raises(errors.IncompatibleValue) as caught:
        declared.decode_result(text, _returns(Order2), where="step 'x' result")
    exc = caught.value
    assert exc.stored == "pydantic 'tests_declared_app:Order' {id: str, total: float}"
    assert exc.expected == "tests_declared_app:Order"
    assert "currency: Field required" in exc.reason
    assert "currency: Field required" in str(exc) and exc.stored in str(exc)


def test_a_field_with_a_default_added_later_decodes(app: types.ModuleType) -> None:
    @dataclasses.dataclass
    class Order:
        id: str

    _define(app, Order, "Order")
    text = _stored(app, [Order("A1"), Order("A2")])

    @dataclasses.dataclass
    class Order2:
        id: str
        currency: str = "EUR"

    _define(app, Order2, "Order")  # same path: the stored class now builds fine too
    assert declared.decode_result(text, _returns(list[Order2]), where="r") == [
        Order2("A1"),
        Order2("A2"),
    ]


def test_a_renamed_dataclass_inside_containers_decodes(app: types.ModuleType) -> None:
    class Colour(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Line:
        sku: str
        colour: Colour

    _define(app, Colour, "Colour")
    _define(app, Line, "Line")
    text = _stored(app, {"a": (Line("s1", Colour.RED),), "b": None})
    del app.Line, app.Colour

    class Hue(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Item:
        sku: str
        colour: Hue

    _define(app, Hue, "Hue")
    _define(app, Item, "Item")
    hint = dict[str, Optional[tuple[Item, ...]]]  # noqa: UP045 (the old spelling is checked too)
    assert declared.decode_result(text, _returns(hint), where="r") == {
        "a": (Item("s1", Hue.RED),),
        "b": None,
    }


def test_a_missing_dataclass_field_names_its_path(app: types.ModuleType) -> None:
    @dataclasses.dataclass
    class Line:
        sku: str

    _define(app, Line, "Line")
    text = _stored(app, {"lines": [Line("s1")]})
    del app.Line

    @dataclasses.dataclass
    class Item:
        sku: str
        qty: int

    _define(app, Item, "Item")
    with pytest.raises(errors.IncompatibleValue) as caught:
        declared.decode_result(text, _returns(dict[str, list[Item]]), where="r")
    assert caught.value.reason == (
        "value.lines[0] lacks the field(s) 'qty' that tests_declared_app:Item requires"
    )
    assert caught.value.expected == "dict[str, list[tests_declared_app:Item]]"
    assert caught.value.stored == "dict {lines: list}"


def test_typed_dicts_and_builtins_are_built_from_the_shape(app: types.ModuleType) -> None:
    @dataclasses.dataclass
    class Order:
        id: str
        total: float

    _define(app, Order, "Order")
    text = _stored(app, Order("A1", 3))
    del app.Order

    class OrderDict(TypedDict):
        id: str
        total: float

    assert declared.decode_result(text, _returns(OrderDict), where="r") == {
        "id": "A1",
        "total": 3.0,
    }
    assert declared.decode_result(text, _returns(dict[str, Any]), where="r") == {
        "id": "A1",
        "total": 3,
    }


def test_no_declared_type_and_a_missing_class_says_so(app: types.ModuleType) -> None:
    @dataclasses.dataclass
    class Order:
        id: str

    _define(app, Order, "Order")
    text = _stored(app, Order("A1"))
    del app.Order
    for hint in (declared.NOTHING, Any):
        with pytest.raises(errors.IncompatibleValue, match="declares no return type") as caught:
            declared.decode_result(text, _returns(hint), where="r")
        assert caught.value.expected == "none declared"
        assert "'tests_declared_app:Order' is not defined" in caught.value.reason


def test_a_loose_annotation_keeps_what_the_stored_class_gives(app: types.ModuleType) -> None:
    """A step that says ``-> Order`` but returned a dict lacking fields worked before:
    it still returns the dict (the stored value decodes), on every run alike."""

    class Order(pydantic.BaseModel):
        id: str
        total: float

    _define(app, Order, "Order")
    text = _stored(app, {"id": "A1"})
    assert declared.decode_result(text, _returns(Order), where="r") == {"id": "A1"}
    assert declared.decode_result("[1, 2]", _returns(dict), where="r") == [1, 2]
    assert declared.decode_result("true", _returns(int), where="r") is True


def test_a_value_of_an_old_class_that_still_exists_becomes_todays_type(
    app: types.ModuleType,
) -> None:
    class Order(pydantic.BaseModel):
        id: str

    class OrderV2(pydantic.BaseModel):
        id: str
        note: str = ""

    _define(app, Order, "Order")
    _define(app, OrderV2, "OrderV2")
    text = _stored(app, Order(id="A1"))
    assert declared.decode_result(text, _returns(OrderV2), where="r") == OrderV2(id="A1")
    assert declared.decode_result(text, _returns(Order | None), where="r") == Order(id="A1")


def test_corrupt_text_stays_a_decode_error() -> None:
    with pytest.raises(errors.DecodeError, match="corrupt JSON") as caught:
        declared.decode_result('{"a": ', _returns(dict), where="r")
    assert not isinstance(caught.value, errors.IncompatibleValue)


def test_forward_references_resolve_when_first_asked() -> None:
    assert declared.declared_result(_later_step) is _Later
    assert declared.type_text(list[_Later] | None) == "list[tests.test_declared:_Later] | None"


def _later_step() -> _Later:
    return _Later()


class _Later:
    pass
