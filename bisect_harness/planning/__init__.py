"""From a spec to a plan: resolved commits, distinct configs, worktrees and per-commit environments."""
