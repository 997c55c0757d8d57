"""Which boots to run next and when to look: the scheduler, the hypothesis loop, bisection and nightly drivers."""
