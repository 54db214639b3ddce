"""Pipelines defined only by the tests (not in the package, not in the examples)."""
