"""Conclave: an MCP server that runs a team of LLM agents from different providers on one task."""

__version__ = "0.1.0"
