"""Deciding, from values only: the statistics, the verdict rule, the bisection and
explain searches, blocks and change points. No I/O, no storage.

The statistics are one method a module: the design and its analyses
(``design``, ``analyses/``), the boundaries of sequential looks (``boundaries``),
the decision kernel (``kernel``), one look's verdict (``evaluate``), Welch's test
and the variance components (``ttest``, ``components``), the sign-flip test
(``signflip``), multiplicity, power and simulation (``multiplicity``, ``power``,
``simulate``) and nightly's rule (``shift``).
"""
