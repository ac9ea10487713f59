"""corral-docker."""
