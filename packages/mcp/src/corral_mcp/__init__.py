"""corral-mcp."""
