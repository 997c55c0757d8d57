"""Deciding, from values only: the statistics, the verdict rule, the bisection and explain searches, blocks and change points. No I/O, no storage."""
