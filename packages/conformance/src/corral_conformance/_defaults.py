"""Constants importable without pytest or hypothesis (the CLI plugin loads this)."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_EXAMPLES"]

DEFAULT_MAX_EXAMPLES: Final = 30
"""Hypothesis examples per property unless ``--corral-max-examples`` says otherwise."""
