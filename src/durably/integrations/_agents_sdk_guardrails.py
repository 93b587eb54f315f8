"""Guardrails of the OpenAI Agents SDK made durable: each guardrail's run is a step.

A guardrail is code of its own, often a model call of its own (``Runner.run`` on a
screening agent), and the SDK runs it again whenever the run is replayed: it would
ask again, pay again, and might decide otherwise on the same input. Wrapped, each
run of an input or output guardrail is the step ``guardrail:input:<name>`` or
``guardrail:output:<name>``, journaling what it decided (``tripwire_triggered``)
and its ``output_info``; a replay hands the SDK the recorded decision. The
``output_info`` comes back as its JSON (a pydantic model as a dict).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

from agents import GuardrailFunctionOutput, InputGuardrail, OutputGuardrail

from durably import steps

G = TypeVar("G", InputGuardrail[Any], OutputGuardrail[Any])
JSON = dict[str, Any]


def durable(guardrail: G) -> G:
    """``guardrail`` whose every run is a step of the running workflow."""
    if getattr(guardrail.guardrail_function, "__durably_guardrail__", False):
        return guardrail
    side = "input" if isinstance(guardrail, InputGuardrail) else "output"
    shown = guardrail.get_name()  # the wrapper's own __name__ would replace it
    name = f"guardrail:{side}:{shown}"
    judge = guardrail.guardrail_function

    async def guardrail_function(context: Any, agent: Any, given: Any) -> GuardrailFunctionOutput:
        async def run() -> JSON:
            output = judge(context, agent, given)
            if inspect.isawaitable(output):
                output = await output
            return {"output_info": output.output_info, "tripwire": output.tripwire_triggered}

        decided: JSON = await steps.run_step(run, name=name)
        return GuardrailFunctionOutput(decided["output_info"], bool(decided["tripwire"]))

    guardrail_function.__durably_guardrail__ = True  # type: ignore[attr-defined]
    return dataclasses.replace(guardrail, guardrail_function=guardrail_function, name=shown)
