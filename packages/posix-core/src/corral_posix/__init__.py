"""corral-posix-core."""
