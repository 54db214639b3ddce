"""A reference run of a pipeline, for users' tests: the framework's own plan over given
records in one local Spark query, with no engine, no gate and no failover
(`twinstream.engine.local`).

Tests compare what engines published through kills and takeovers with this: the same
transform, the same validation, other batch boundaries (`batches` files, one per
micro-batch). A pipeline that keeps the contract's rule gives the same rows.
"""

from __future__ import annotations

from twinstream.engine.local import run, session

__all__ = ["run", "session"]
