"""The drivers: the boot scheduler with one measuring call, and the loops that use it
(hypotheses, bisect, explain, nightly, resume)."""
