"""corral-local-sandbox."""
