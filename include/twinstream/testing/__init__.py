"""Kits for tests, drills and benchmarks: inputs and checks that no engine imports."""
