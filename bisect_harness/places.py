"""Where the harness keeps its files on this machine: the cache folder.

The ground floor beside ``model`` and ``errors``: the checkout's mirrors and
worktrees (``engines/checkout``) and the supervisors' records of their process
trees (``process/supervised``) both live under it, and neither imports the other
to find it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir"]


def default_cache_dir() -> Path:
    """``$BISECT_HARNESS_CACHE``, else ``$XDG_CACHE_HOME/bisect-harness``, else
    ``~/.cache/bisect-harness``."""
    env = os.environ.get("BISECT_HARNESS_CACHE")
    if env:  # absolute: git resolves a relative worktree path against the mirror, not this folder
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "bisect-harness"
