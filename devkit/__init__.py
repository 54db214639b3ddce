"""The developers' kit for tests, drills and benchmarks: stacks, loads, faults and checks.
Not part of the product package: nothing under include/twinstream imports it."""
