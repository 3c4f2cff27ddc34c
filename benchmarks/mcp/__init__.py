"""MCP servers as real tool backends (the official ``mcp`` SDK): `MCPBackend`, and the ``mcp`` suite."""

from benchmarks.mcp.backend import MCPBackend, result_text
from benchmarks.mcp.suite import MCPSuite

__all__ = ["MCPBackend", "MCPSuite", "result_text"]
