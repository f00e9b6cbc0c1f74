"""The MCP server: registers `conclave.tools`, serves job resources, runs the stdio and HTTP transports."""
