"""bisect-harness: hypothesis-driven regression bisection for LLM inference engines."""

__version__ = "0.1.0"
