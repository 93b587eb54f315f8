"""Tool schemas from hints and docstrings, argument validation, and @tool's checks."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Literal

import pydantic
import pytest

import durably
from durably import agents
from durably.agents import schema


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Window:
    start: str
    days: int = 7


class Address(pydantic.BaseModel):
    street: str
    zip: str = pydantic.Field(description="Postal code")


def refund(
    order_id: str,
    cents: int,
    note: str | None = None,
    mode: Literal["fast", "slow"] = "fast",
    tags: list[str] = [],  # noqa: B006 - a default the schema must show
    weights: dict[str, float] | None = None,
    urgent: bool = False,
    json: int = 1,
) -> None:
    """Refund part of an order.

    Not part of the description.

    Args:
        order_id: The order, as printed
            on the receipt.
        cents (int): Amount in cents.
        mode: How fast.

    Returns:
        Nothing.
    """


EXPECTED = {
    "additionalProperties": False,
    "properties": {
        "order_id": {"description": "The order, as printed on the receipt.", "type": "string"},
        "cents": {"description": "Amount in cents.", "type": "integer"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "mode": {
            "default": "fast",
            "description": "How fast.",
            "enum": ["fast", "slow"],
            "type": "string",
        },
        "tags": {"default": [], "items": {"type": "string"}, "type": "array"},
        "weights": {
            "anyOf": [
                {"additionalProperties": {"type": "number"}, "type": "object"},
                {"type": "null"},
            ],
            "default": None,
        },
        "urgent": {"default": False, "type": "boolean"},
        "json": {"default": 1, "type": "integer"},
    },
    "required": ["order_id", "cents"],
    "type": "object",
}


@pytest.mark.parametrize("use_pydantic", [True, False], ids=["pydantic", "fallback"])
def test_schema_from_hints_defaults_and_docstring(use_pydantic: bool) -> None:
    sig = schema.signature(refund, name="refund", use_pydantic=use_pydantic)
    assert sig.description == "Refund part of an order."
    assert sig.parameters == EXPECTED
    kwargs, shown = sig.validate({"order_id": "A1", "cents": 5})
    assert kwargs == {
        "order_id": "A1",
        "cents": 5,
        "note": None,
        "mode": "fast",
        "tags": [],
        "weights": None,
        "urgent": False,
        "json": 1,
    }
    assert shown == kwargs
    with pytest.raises(schema.InvalidArguments, match="mode"):
        sig.validate({"order_id": "A1", "cents": 5, "mode": "warp"})
    with pytest.raises(schema.InvalidArguments, match="cents"):
        sig.validate({"order_id": "A1"})
    with pytest.raises(schema.InvalidArguments, match=r"surprise: (Extra inputs|unexpected)"):
        sig.validate({"order_id": "A1", "cents": 5, "surprise": 1})


def ship(address: Address, at: Annotated[int, pydantic.Field(ge=0)] = 0) -> None:
    """Ship to an address."""


def test_pydantic_model_arguments_become_defs_and_are_validated_into_models() -> None:
    sig = schema.signature(ship, name="ship")
    assert sig.parameters == {
        "$defs": {
            "Address": {
                "properties": {
                    "street": {"type": "string"},
                    "zip": {"description": "Postal code", "type": "string"},
                },
                "required": ["street", "zip"],
                "type": "object",
            }
        },
        "additionalProperties": False,
        "properties": {
            "address": {"$ref": "#/$defs/Address"},
            "at": {"default": 0, "minimum": 0, "type": "integer"},
        },
        "required": ["address"],
        "type": "object",
    }
    kwargs, shown = sig.validate({"address": {"street": "Main St", "zip": "1000"}})
    assert kwargs["address"] == Address(street="Main St", zip="1000")
    assert shown == {"address": {"street": "Main St", "zip": "1000"}, "at": 0}
    with pytest.raises(schema.InvalidArguments, match="at"):
        sig.validate({"address": {"street": "s", "zip": "z"}, "at": -1})


def plan(window: Window, color: Color = Color.RED, pair: tuple[int, str] | None = None) -> None:
    """Plan."""


@pytest.mark.parametrize("use_pydantic", [True, False], ids=["pydantic", "fallback"])
def test_dataclass_and_enum_arguments(use_pydantic: bool) -> None:
    sig = schema.signature(plan, name="plan", use_pydantic=use_pydantic)
    props = sig.parameters["properties"]
    assert props["color"]["default"] == "red"
    window = props["window"]
    if "$ref" in window:
        window = sig.parameters["$defs"]["Window"]
    assert window["properties"] == {
        "start": {"type": "string"},
        "days": {"default": 7, "type": "integer"},
    }
    kwargs, shown = sig.validate({"window": {"start": "mon"}, "color": "blue", "pair": [1, "x"]})
    assert kwargs["window"] == Window("mon", 7)
    assert kwargs["color"] is Color.BLUE and kwargs["pair"] == (1, "x")
    assert shown == {"window": {"start": "mon", "days": 7}, "color": "blue", "pair": [1, "x"]}


def test_docstring_styles() -> None:
    google = schema.parse_docstring(
        """Look something up.

        Arguments:
            query (str): What to look for;
                may span lines.
            limit: At most this many.
        Raises:
            KeyError: not a parameter.
        """
    )
    assert google == schema.Docstring(
        "Look something up.",
        {"query": "What to look for; may span lines.", "limit": "At most this many."},
    )
    sphinx = schema.parse_docstring(
        "Send it\nnow.\n\n:param to: the address\n    in full\n:returns: x"
    )
    assert sphinx == schema.Docstring("Send it now.", {"to": "the address in full"})
    assert schema.parse_docstring(None) == schema.Docstring("", {})


def test_the_tool_decorator_records_a_step_the_model_can_call() -> None:
    @agents.tool(name="lookup", description="Find it.", retry=durably.Retry(max_attempts=2))
    async def lookup_thing(key: str) -> str:
        """Ignored docstring."""
        return key

    assert lookup_thing.definition() == {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "additionalProperties": False,
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
                "type": "object",
            },
            "description": "Find it.",
        },
    }
    assert lookup_thing.step.definition.name == "tool:lookup"
    assert (
        lookup_thing.__name__ == "lookup_thing" and repr(lookup_thing) == "<durably tool 'lookup'>"
    )


async def test_a_tool_outside_a_workflow_is_a_plain_call() -> None:
    @agents.tool(requires_approval=True)
    def double(x: int) -> int:
        return 2 * x

    assert await double(21) == 42


def test_bad_tools_fail_at_decoration_time() -> None:
    def star(*args: Any) -> None: ...

    def kw(**kwargs: Any) -> None: ...

    def fine(x: int) -> None: ...

    def untyped_object(x: object) -> None: ...

    with pytest.raises(durably.DefinitionError, match="named parameters only"):
        agents.tool(star)
    with pytest.raises(durably.DefinitionError, match="named parameters only"):
        agents.tool(kw)
    with pytest.raises(durably.DefinitionError, match="letters, digits"):
        agents.tool(name="has space")(fine)
    with pytest.raises(durably.DefinitionError, match="requires_approval"):
        agents.tool(requires_approval="yes")(fine)  # type: ignore[arg-type]
    with pytest.raises(durably.DefinitionError, match="on_approval_timeout"):
        agents.tool(on_approval_timeout="maybe")(fine)  # type: ignore[arg-type]
    with pytest.raises(durably.DefinitionError, match="already a step"):
        agents.tool(durably.step(fine))
    with pytest.raises(durably.DefinitionError, match="two tools named"):
        agents.Agent(client=None, model="m", tools=[fine, fine])
    with pytest.raises(durably.DefinitionError):

        class Opaque:
            pass

        def opaque(x: Opaque) -> None: ...

        schema.signature(opaque, name="opaque", use_pydantic=False)
    assert schema.signature(untyped_object, name="u", use_pydantic=False).parameters[
        "properties"
    ] == {"x": {}}
