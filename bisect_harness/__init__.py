"""bisect-harness: hypothesis-driven regression bisection for LLM inference engines.

The command line (``harness run hypotheses.yaml``) is the usual way in; the library
is small on purpose::

    from bisect_harness import load_spec, make_plan, Ledger, Executor

    spec = load_spec("hypotheses.yaml")
    with Ledger("sqlite:///results.db") as ledger:
        run = Executor(make_plan(spec), ledger, log_dir=Path("experiments/logs")).execute()
        for h in run.hypotheses:
            print(h.hid, h.verdict.outcome, h.verdict.ratio)

The statistics (``bisect_harness.decide``: ``design``, ``evaluate`` and their kin) and the bisection search
(``bisect_harness.decide.bisect.search``) are pure and usable on their own.
"""

__version__ = "0.1.0"

# Exports load on first use, so `harness --help` and `import bisect_harness` stay fast
# and a missing optional tool (git, a GPU) only matters to the part that needs it.
_EXPORTS = {
    "BisectionSearch": "decide.bisect.search", "BisectResult": "decide.bisect.result",
    "BootFailed": "errors", "BootTimeout": "errors", "BuildFailed": "errors", "CommitError": "errors",
    "ConfigFailure": "errors", "HarnessError": "errors", "InfrastructureError": "errors",
    "SpecError": "errors", "UserError": "errors",
    "Executor": "run.executor", "Ledger": "record.ledger",
    "Arm": "model", "BenchmarkSpec": "model", "Better": "model", "Expect": "model", "Metric": "model",
    "Outcome": "model", "SampleOutcome": "boot",
    "make_plan": "plan.build", "Spec": "spec", "load_spec": "spec",
    "Design": "decide.design", "StatVerdict": "decide.evaluate", "evaluate": "decide.evaluate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bisect_harness' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
