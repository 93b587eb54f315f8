"""Structured output: the agent's final answer as a validated value of ``output_type``.

``Agent(output_type=Model)`` asks the provider for JSON that fits the type's
schema (``response_format`` json_schema, strict where the schema allows it),
validates the final answer with pydantic, and when it does not fit tells the
model what is wrong and asks again, at most ``output_retries`` times. The
validated value is journaled as its own step (``output:<agent name>``), so a
replay returns the value the live run accepted.

Validation runs again on every replay of the turns before it, so the loop takes
the same path: the same invalid answers come back from the journal, the same
corrections are added, and no model request is made again.

Strict schemas: OpenAI's strict mode wants every object closed
(``additionalProperties: false``) with every property required. A schema that
already has all properties required is closed and sent strict; one with
optional properties is sent as it is, not strict (changing which fields are
optional would change the type the user declared).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from durably.agents import exceptions

JSON = dict[str, Any]


class Output:
    """The ``output_type`` of an agent: its schema, its validator, its correction message."""

    def __init__(self, output_type: Any, *, strict: bool = True) -> None:
        import pydantic

        self.output_type = output_type
        self.adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(output_type)
        schema = self.adapter.json_schema()
        closed = strict_schema(schema) if strict else None
        self.schema: JSON = closed if closed is not None else schema
        self.strict = closed is not None
        self.name = _schema_name(output_type)
        self.accepted = _accepting(output_type)

    def response_format(self) -> JSON:
        """The chat completions ``response_format`` asking for this schema."""
        spec: JSON = {"name": self.name, "schema": self.schema, "strict": self.strict}
        return {"type": "json_schema", "json_schema": spec}

    def validate(self, text: str | None) -> Any:
        """The answer as a value of ``output_type``; ValueError with what the model must fix."""
        import pydantic

        if not text:
            raise ValueError("the answer was empty; reply with a JSON value")
        try:
            json.loads(text)
        except ValueError as exc:
            raise ValueError(f"the answer is not valid JSON ({exc})") from None
        try:
            return self.adapter.validate_json(text)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'the value'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"the answer does not fit the schema: {problems}") from None

    def correction(self, problem: str) -> JSON:
        """The user message that asks the model for a corrected answer."""
        schema = json.dumps(self.schema, separators=(",", ":"))
        return {
            "role": "user",
            "content": (
                f"Your last answer is not usable: {problem}. Reply again with only a JSON "
                f"value that fits this JSON schema, and nothing else: {schema}"
            ),
        }

    def exhausted(self, tries: int, problem: str) -> exceptions.OutputValidationError:
        """The error raised when no answer fitted within the retries."""
        return exceptions.OutputValidationError(
            f"the model's {tries} answers did not fit output_type {self.name}; "
            f"the last one: {problem}"
        )


def strict_schema(schema: JSON) -> JSON | None:
    """``schema`` with every object closed, or None when an object has optional properties.

    None also for schemas OpenAI's strict mode refuses at the top (not an object).
    """
    out = copy.deepcopy(schema)
    if out.get("type") != "object":
        return None
    return out if _close(out) else None


def _close(node: Any) -> bool:
    if isinstance(node, list):
        return all(_close(x) for x in node)
    if not isinstance(node, dict):
        return True
    if node.get("type") == "object" or "properties" in node:
        properties = node.get("properties") or {}
        if set(node.get("required") or ()) != set(properties):
            return False
        if node.get("additionalProperties") not in (None, False):
            return False
        node["additionalProperties"] = False
    return all(_close(v) for k, v in node.items() if k not in ("required", "enum", "const"))


def _schema_name(output_type: Any) -> str:
    name = getattr(output_type, "__name__", None) or "output"
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in str(name))[:64]


def _accepting(output_type: Any) -> Any:
    """The step function that journals a validated final answer, declaring ``output_type``.

    A replay returns the recorded answer, decoded into the agent's ``output_type`` of
    today (see :mod:`durably.declared`): a class renamed while the workflow was parked
    still decodes.
    """

    def accepted(value: Any) -> Any:
        return value

    accepted.__annotations__ = {"value": Any, "return": output_type}
    return accepted
