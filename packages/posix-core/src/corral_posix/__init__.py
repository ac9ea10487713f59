"""corral-posix-core: shared POSIX plumbing for corral providers.

Race-free filesystem beneath a directory fd, guarded subprocess shell, the
CommandWrapper seam for OS sandboxes, and the tmpdir workspace layout and
snapshot store that local-bash, local-sandbox and docker share.
"""

from __future__ import annotations

__all__: list[str] = []
