"""Owning processes: every process the harness starts runs in its own group, under a
deadline, and is stopped with it."""
