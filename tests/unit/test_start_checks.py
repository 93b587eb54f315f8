"""The checks every start makes, on their fast paths and off them: the same answers.

A start checks its arguments against the workflow function, its delay as a number,
and makes a random id; each has a cheap path for the usual case (issue 12, tenth
pass). These tests hold each to what the slow path decides.
"""

from __future__ import annotations

import fractions
import functools
import inspect
import math
import os
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from durably import errors, validate, workflows


def test_a_random_workflow_id_is_the_hex_of_a_version_4_uuid() -> None:
    ids = [workflows.new_workflow_id(None) for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for wid in ids:
        parsed = uuid.UUID(hex=wid)
        assert (parsed.hex, parsed.version, parsed.variant) == (wid, 4, uuid.RFC_4122)
    # the random bits vary: every hex digit but the version's takes many values
    for i in range(32):
        seen = {wid[i] for wid in ids}
        assert len(seen) >= {12: 1, 16: 4}.get(i, 12), (i, seen)
    assert {wid[12] for wid in ids} == {"4"}  # the version
    assert {wid[16] for wid in ids} == set("89ab")  # the variant's two bits, two random


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_makes_other_ids_than_its_parent() -> None:
    # Random bytes are read 4 KiB at a time: a child that kept its parent's unread ones
    # would hand out the very ids the parent makes next.
    workflows._RANDOM.forget()
    workflows.new_workflow_id(None)  # the pool holds 4,080 unread bytes at the fork
    read, write = os.pipe()
    with warnings.catch_warnings():  # (Python 3.12+ warns of a fork with threads running)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its next ids, through the pipe
        try:
            os.write(write, " ".join(workflows.new_workflow_id(None) for _ in range(8)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [workflows.new_workflow_id(None) for _ in range(8)]
    assert len(child) == 8
    assert not set(child) & set(parent)


async def _plain(a: int, b: int) -> None: ...
async def _defaults(a: int, b: int = 1) -> None: ...
async def _star(a: int, *rest: int) -> None: ...
async def _keyword_only(a: int, *, b: int) -> None: ...
async def _keywords(a: int, **more: int) -> None: ...
async def _positional_only(a: int, b: int, /) -> None: ...
async def _none() -> None: ...


class _Method:
    async def run(self, a: int, b: int) -> None: ...


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]

    async def __call__(self, a: int, b: int) -> None: ...


async def _overridden(*args: Any, **kwargs: Any) -> None: ...


_overridden.__signature__ = inspect.signature(_plain)  # type: ignore[attr-defined]


_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1,), {}),
    ((1, 2), {}),
    ((1, 2, 3), {}),
    ((1,), {"b": 2}),
    ((), {"a": 1, "b": 2}),
    ((1, 2), {"c": 3}),
]


#: Each callable, and how many arguments a call must pass by position for the check to skip
#: ``Signature.bind`` (-1: never; bind decides).
_FUNCTIONS: list[tuple[Callable[..., Any], int]] = [
    (_plain, 2),
    (_defaults, -1),
    (_star, -1),
    (_keyword_only, -1),
    (_keywords, -1),
    (_positional_only, 2),
    (_none, 0),
    (functools.partial(_plain, 1), 1),
    (functools.partial(_plain, b=1), -1),
    (_Method().run, 2),  # its self is not counted
    (_Unhashable(), 2),  # its signature read each time, not cached
    (_overridden, 2),  # its __signature__, as inspect.signature reads it
]


@pytest.mark.parametrize(("fn", "arity"), _FUNCTIONS, ids=[str(i) for i in range(len(_FUNCTIONS))])
def test_a_start_accepts_exactly_the_calls_the_function_binds(
    fn: Callable[..., Any], arity: int
) -> None:
    # the fast path is taken where it can be
    assert workflows._plain_arity(inspect.signature(fn)) == arity
    name = getattr(fn, "__name__", "partial")
    definition = workflows.WorkflowDefinition(fn=fn, name=name, version=None, source_hash=None)
    for args, kwargs in _CALLS:
        try:
            inspect.signature(fn).bind(*args, **kwargs)
            binds = True
        except TypeError:
            binds = False
        if binds:
            workflows.check_arguments(definition, args, kwargs)
        else:
            with pytest.raises(errors.WorkflowArgumentsError, match=name):
                workflows.check_arguments(definition, args, kwargs)


class _Int(int):
    pass


class _Float(float):
    pass


@pytest.mark.parametrize(
    ("value", "bounds", "expected"),
    [
        (0, {}, 0.0),
        (2, {}, 2.0),
        (2.5, {}, 2.5),
        (_Int(3), {}, 3.0),
        (_Float(0.5), {}, 0.5),
        (fractions.Fraction(1, 4), {}, 0.25),
        (True, {}, "finite number >= 0"),
        (False, {}, "finite number >= 0"),
        ("1", {}, "finite number >= 0"),
        (None, {}, "finite number >= 0"),
        (math.nan, {}, "not NaN or infinity"),
        (math.inf, {}, "not NaN or infinity"),
        (-math.inf, {"low": -math.inf}, "not NaN or infinity"),
        (-1, {}, "must be >= 0"),
        (-0.5, {}, "must be >= 0"),
        (0, {"above": True}, "must be > 0"),
        (0.0, {"above": True}, "must be > 0"),
        (_Int(0), {"above": True}, "must be > 0"),
        (1e-9, {"above": True}, 1e-9),
        (5, {"high": 4}, "within [0, 4]"),
        (4, {"high": 4}, 4.0),
        (-3, {"low": -math.inf}, -3.0),
        (-0.0, {}, -0.0),
        (-0.0, {"above": True}, "must be > 0"),
        (math.nan, {"low": -math.inf}, "not NaN or infinity"),
        (math.nan, {"high": 4}, "within [0, 4], not NaN or infinity"),
        (_Float(math.nan), {}, "not NaN or infinity"),
        (_Int(5), {"high": 4}, "within [0, 4]"),
    ],
)
def test_a_number_is_taken_or_refused_as_before(
    value: object, bounds: dict[str, Any], expected: float | str
) -> None:
    if isinstance(expected, float):
        got = validate.number(value, "delay", **bounds)
        assert got == expected and type(got) is float
    else:
        with pytest.raises(ValueError) as caught:
            validate.number(value, "delay", **bounds)
        assert str(caught.value).startswith(f"delay={value!r}: must be"), caught.value
        assert expected in str(caught.value), caught.value


def test_a_number_too_large_for_a_float_raises_as_before() -> None:
    with pytest.raises(OverflowError):
        validate.number(10**400, "delay")
