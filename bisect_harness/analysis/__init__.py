"""From boots to verdicts: the verdict rule, the statistics, the noisy bisection search, host drift."""
