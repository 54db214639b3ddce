"""Warm spares for the tests' engines: a keeper of the product's own
(twinstream.engine.spare_keeper) in the test process, whose spares `Pipeline.start` asks to
become the engine it would otherwise start cold. The scenario is the same (an engine process
under its id, with its checkpoint, its port and its environment, killed and stopped by its
pid); only its first seconds are shorter. A spare that refuses (a test's own heap, JVM
options or Spark master) or none warm yet: the engine starts cold, as before.

`POOL` is set by the test session's stack fixture (tests/conftest.py); benchmarks leave it
None and start every engine cold, as they measure.
"""

from __future__ import annotations

from twinstream.engine.spare_keeper import Keeper

__all__ = ["POOL", "POOL_SIZE", "Keeper"]

# Two: a test starts its engines in pairs; each one taken is replaced at once.
POOL_SIZE = 2

POOL: Keeper | None = None
