"""The prefix every line an engine logs about its pipeline carries.

`EngineLog` is a `LoggerAdapter` that says "engine <id> pipeline <name>: " before the message
and gives both as the record's `extra` (`engine`, `pipeline`), so that a log handler may
filter or format by them. An engine builds one and hands it to its parts; each part logs
under its own module's logger (`named`), so a record's logger name still says where it was
written. The core knows no pipeline: it is given the adapter, or builds one from the ids it
is given.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any


class EngineLog(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, engine_id: str, pipeline: str) -> None:
        super().__init__(logger, {"engine": engine_id, "pipeline": pipeline})
        self.engine_id = engine_id
        self.pipeline = pipeline
        # A message is a %-format: an id holding "%" must not be read as one.
        self._prefix = f"engine {engine_id} pipeline {pipeline}: ".replace("%", "%%")

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return f"{self._prefix}{msg}", kwargs

    def named(self, name: str) -> EngineLog:
        """The same engine and pipeline, logged under the logger `name` (a module's)."""
        return EngineLog(logging.getLogger(name), self.engine_id, self.pipeline)
