"""schemathesis against the OpenAPI document, with a token: no 5xx, and no route ignores auth.

schemathesis generates requests from /openapi.json (path and query parameters,
bodies) and sends them to the app in process (ASGI) with the bearer token. The
checks: no answer is a 5xx; every answer's status code and content type are
ones the document declares; and ``ignored_auth``, which sends each request
again without the token (and with a wrong one) and fails when it is not
refused. /api/events is left out here: it is a stream that stays open (its
refusals and errors are tested in test_server_events and by the hypothesis fuzz
in test_server_api, which closes it at once).
"""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis
import pytest
import schemathesis
from schemathesis import checks
from starlette.applications import Starlette
from starlette.testclient import TestClient

import durably
from durably.server import app, auth
from tests.serverkit import harness

BEARER = {"Authorization": f"Bearer {harness.SECRET}"}


@pytest.fixture
def served(sqlite_url: str) -> Iterator[Starlette]:
    asgi = app.create_app(sqlite_url, auth.parse_tokens(harness.TOKEN, "test"))
    durably.Client(sqlite_url).start("srv-wait", workflow_id="w")
    with TestClient(asgi):  # runs the lifespan: the app's Client is open while it runs
        yield asgi


@pytest.fixture
def api_schema(served: Starlette) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", served, headers=BEARER)


CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.ignored_auth,
]


def test_no_generated_request_gets_a_5xx_and_none_passes_without_the_token(
    api_schema: schemathesis.BaseSchema, subtests: pytest.Subtests
) -> None:
    """Each operation of the document, a subtest of its own, with hypothesis's own
    ``@given`` over the operation's strategy (schemathesis's pytest fixture loader reads
    a pytest internal that pytest 9.2 removed)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 10, [op.label for op in operations]
    for operation in operations:
        if operation.path == "/api/events":
            continue

        @hypothesis.settings(
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
            database=None,
        )
        @hypothesis.given(case=operation.as_strategy())
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=BEARER, checks=CHECKS)

        with subtests.test(msg=operation.label):
            check()
