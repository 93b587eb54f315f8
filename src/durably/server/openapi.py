"""The OpenAPI 3.1 document of the API, made from the routes' own declarations.

:data:`durably.server.api.ROUTES` is the one list both the router and this
document read, so a route cannot exist without being described.
"""

from __future__ import annotations

import re
from typing import Any

from durably.server import api

_REASONS = {
    200: "OK",
    201: "Created",
    401: "No valid bearer token or session",
    403: "A session request that changes state without its CSRF token",
    404: "No workflow with that id",
    409: "Conflicts with the workflow's state (already decided, nothing pending, stale)",
    413: "The request body is larger than the server accepts (durably serve --max-body-bytes)",
    422: "Bad input; the message names the field",
    503: "The database is unavailable",
}

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "required": ["type", "message"],
        }
    },
}


def document(version: str) -> dict[str, Any]:
    """The OpenAPI document of every declared route."""
    paths: dict[str, dict[str, Any]] = {}
    for spec, handler in api.ROUTES:
        paths.setdefault(spec.path, {})[spec.method.lower()] = _operation(spec, handler.__name__)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "durably",
            "version": version,
            "description": "Read, start and decide durable workflows. Every route needs "
            "'Authorization: Bearer <token>' (or a dashboard session cookie).",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


def _operation(spec: api.Spec, operation_id: str) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": _path_schema(name),
            **({"description": _ID} if name == "workflow_id" else {}),
        }
        for name in re.findall(r"{(\w+)}", spec.path)
    ]
    for p in spec.query:
        schema: dict[str, Any] = {"type": p.type}
        if p.enum:
            schema["enum"] = list(p.enum)
        parameters.append(
            {
                "name": p.name,
                "in": "query",
                "required": False,
                "description": p.description,
                "schema": schema,
            }
        )
    ok_schema: dict[str, Any] = (
        {"type": "object"} if spec.media == "application/json" else {"type": "string"}
    )
    responses: dict[str, Any] = {
        str(spec.ok): {
            "description": _REASONS[spec.ok],
            "content": {spec.media: {"schema": ok_schema}},
        }
    }
    codes = sorted(
        {
            401,
            *spec.errors,
            # a request that changes state carries a body, which may be over the limit
            *((403, 413) if spec.method != "GET" else ()),
            # a body that is not a JSON object, or a query value no database can hold (a NUL)
            *((422,) if spec.body is not None or spec.query else ()),
        }
    )
    for code in codes:
        responses[str(code)] = {
            "description": _REASONS[code],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": spec.summary,
        "parameters": parameters,
        "responses": responses,
    }
    if spec.body is not None:
        operation["requestBody"] = {
            "required": bool(spec.body.get("required")),
            "content": {"application/json": {"schema": spec.body}},
        }
    return operation


_ID = "The workflow's id as one path segment, percent-encoded: a '/' in it as %2F."


def _path_schema(name: str) -> dict[str, Any]:
    return {"type": "integer"} if name == "seq" else {"type": "string"}
