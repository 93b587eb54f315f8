"""A real MCP server (stdio) for the integration tests: order tools that log every call.

    python -m tests.integkit.mcp_orders LOG

Each ``tools/list`` and ``tools/call`` it answers is appended to LOG as one JSON
line (fsync'd before the answer), so a test in another process counts what the
server did: the ground truth that no completed MCP call was made again.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

log_path = sys.argv[1] if len(sys.argv) > 1 else os.devnull


def _log(**line: Any) -> None:
    if log_path == os.devnull:
        return
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(json.dumps({**line, "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


class _LoggedServer(MCPServer):
    async def list_tools(self) -> Any:
        _log(method="tools/list")
        return await super().list_tools()


server: MCPServer = _LoggedServer("orders")


@server.tool()
def ship_order(order_id: str) -> str:
    """Ship an order (an effect: each call ships it again)."""
    _log(method="tools/call", tool="ship_order", order_id=order_id)
    return f"shipped {order_id}"


@server.tool()
def order_status(order_id: str) -> str:
    """Look an order's status up."""
    _log(method="tools/call", tool="order_status", order_id=order_id)
    return f"{order_id}: delivered"


if __name__ == "__main__":
    server.run()
