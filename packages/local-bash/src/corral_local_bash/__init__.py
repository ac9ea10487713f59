"""corral-local-bash."""
