"""corral-conformance."""
