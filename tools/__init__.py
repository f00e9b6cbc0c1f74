"""The MCP tools Conclave publishes, one module per tool."""
