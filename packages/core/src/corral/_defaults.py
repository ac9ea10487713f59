"""Defaults every provider shares, so a workspace keeps its limits whichever provider backs it."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_FILE_BYTES"]

DEFAULT_MAX_FILE_BYTES: Final = 10 * 1024 * 1024
"""The largest file a provider's filesystem reads or writes unless configured otherwise.

One value for every provider, so a workspace moved between providers keeps
its limits. It is 10 MiB because that is what the tool layer lets the model
have by default (``FsPolicy.max_file_size_mb``): a larger provider cap only
costs memory, since ``read_file`` holds the whole file in memory (and the
tool layer a decoded copy of it), which matters when many sessions share a
process. What agents read -- source files, configuration, logs -- is almost
always far smaller; 10 MiB of text is millions of tokens, more than any
model's context. Raise it per provider (``max_file_bytes``) together with
the policy when an application moves large artifacts through the module
API.
"""
