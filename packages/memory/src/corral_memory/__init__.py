"""corral-memory."""
