"""The failover core: election, gate, fencing publisher, rows and headers, quarantine and
checkpoint rewind. It knows no pipeline: examples and users' pipelines depend on it, never
the reverse (tests/unit/test_wings.py enforces it). Each module states its
guarantee in its docstring."""
