"""Pipelines of three versions for the versions' and deploys' tests: the example under a
declared version 1, a version 2 with the same state and another output, and a version 3
whose state has another shape (a count of each host's records beside its window)."""

from __future__ import annotations

import uuid
from pathlib import Path

# The example's declaration under a version of its own: what an owner's `version="1"` is.
VERSIONED = """import dataclasses

from pipelines.hostmetrics.pipeline import pipeline as example

pipeline = dataclasses.replace(example, version="1")
"""

# Version 2: the same state, another output (each value gains a member), as a change of an
# owner's output logic is.
CHANGED = """import dataclasses

from pipelines.hostmetrics.pipeline import HostStep, pipeline as example


class StepV2(HostStep):
    def __call__(self, state, record):
        new_state, out = super().__call__(state, record)
        return new_state, {"host": out["host"], "value": out["value"][:-1] + ', "v": 2}'}


pipeline = dataclasses.replace(
    example, version="2", keyed=dataclasses.replace(example.keyed, step=StepV2())
)
"""


# Version 3: the state gains a member (each host's count of records), so its shape changes
# and the first engine of the version must rebuild it by a replay; each value says the count.
RESHAPED = """import dataclasses

from pipelines.hostmetrics.pipeline import STATE, HostStep, pipeline as example


class StepV3(HostStep):
    def __call__(self, state, record):
        seen = 0 if state is None else state[3]
        new_state, out = super().__call__(None if state is None else state[:3], record)
        value = out["value"][:-1] + f', "n": {seen + 1}}}'
        return (*new_state, seen + 1), {"host": out["host"], "value": value}


pipeline = dataclasses.replace(
    example,
    version="3",
    keyed=dataclasses.replace(example.keyed, step=StepV3(), state=STATE + ", seen BIGINT"),
)
"""


def versioned_package(stack_env: dict[str, str], code: str) -> tuple[str, Path]:
    """A pipeline package beside the stack's pipelines file, whose folder the engines put
    on the path: (its name, its folder)."""
    package = f"versioned_{uuid.uuid4().hex[:8]}"
    folder = Path(stack_env["TWINSTREAM_PIPELINES_FILE"]).parent / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "pipeline.py").write_text(code)
    return package, folder
