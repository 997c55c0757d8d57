"""``python -m bisect_harness.cli``: the ``harness`` command, as the console script runs it."""

from bisect_harness.cli import main

if __name__ == "__main__":
    main()
