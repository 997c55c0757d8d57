"""The bisection: a search over a commit range for the first commit whose metric moved,
under noise, from values only (no I/O, no storage; its driver is ``run.bisect_runner``).

One concept a module: the search, stepped round by round (``search``: ``BisectionSearch``,
its stop reasons and paired tests), the likelihood of a step behind its posterior
(``model``), the boots a search may spend (``budget``), its options (``options``:
``SearchOptions``) and its answer (``result``: ``BisectResult``).
"""
