"""A `Keyed` pipeline's step in plain Python, as the engines run it: for a user's unit
tests and the platform's reference runs, no Spark.

`run(pipeline, records, batches)` feeds the records (dicts as the step receives them:
the schema's members, derived columns and `msg_id`) through `twinstream.engine.state.keyed.Runner`
partition by partition, in `batches` slices, and checks every new state against the
pipeline's `Keyed.state` (a tuple of that many fields). The outcome does not depend on
`batches`: a test that compares two batchings checks the contract's one rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from twinstream.contract import MSG_ID, ContractError, Keyed, Pipeline, field_types
from twinstream.core.rows import DLQ, OUT
from twinstream.engine.state.keyed import Partition, Runner


@dataclass
class Outcome:
    """Per record, in the order given: ("out", [output dicts]), ("none", []) or
    ("dlq", reason); and the final state of every key, per partition."""

    records: dict[int, tuple[str, Any]] = field(default_factory=dict)
    states: dict[int, dict[Any, Any]] = field(default_factory=dict)

    def outputs(self) -> list[dict[str, Any]]:
        """Every output, each with its msg_id, in msg_id order."""
        return [
            {MSG_ID: msg_id, **row}
            for msg_id, (kind, rows) in sorted(self.records.items())
            if kind == OUT
            for row in rows
        ]


def checked(keyed: Keyed) -> Callable[[Any, dict[str, Any]], tuple[Any, Any]]:
    """The step, wrapped to refuse a new state that is not a tuple of `Keyed.state`'s
    fields (what the engine stores)."""
    names = list(field_types(keyed.state))

    def step(state: Any, record: dict[str, Any]) -> tuple[Any, Any]:
        new_state, outputs = keyed.step(state, record)
        if new_state is not None and (
            not isinstance(new_state, tuple) or len(new_state) != len(names)
        ):
            raise ContractError(
                f"the step returned the state {new_state!r}; Keyed.state declares a tuple of "
                f"{len(names)} ({', '.join(names)}): return one, or None to forget the key"
            )
        return new_state, outputs

    return step


def run(
    pipeline: Pipeline,
    records: Sequence[Mapping[str, Any]],
    batches: int = 1,
    partition_of: Callable[[Mapping[str, Any]], int] = lambda record: 0,
) -> Outcome:
    if pipeline.keyed is None or pipeline.partition_by is None:
        raise ContractError(f"pipeline {pipeline.name} declares no Keyed step")
    keyed = replace(pipeline.keyed, step=checked(pipeline.keyed))
    columns = list(field_types(keyed.output))
    runner = Runner(keyed, pipeline.partition_by, columns)
    by_partition: dict[int, list[Mapping[str, Any]]] = {}
    for record in records:
        by_partition.setdefault(partition_of(record), []).append(record)
    outcome = Outcome()
    for number, part in sorted(by_partition.items()):
        part.sort(key=lambda r: int(r[MSG_ID]))
        state = Partition()
        size = max(1, -(-len(part) // max(1, batches)))
        for first in range(0, len(part), size):
            chunk = part[first : first + size]
            result = runner.run(state, chunk)
            runner.sweep(state, result.changed)
            position = 0
            for record, kind, letter in zip(chunk, result.kinds, result.letters, strict=True):
                msg_id = int(record[MSG_ID])
                if kind == DLQ:
                    outcome.records[msg_id] = (DLQ, letter)
                    continue
                emitted = []
                while position < len(result.out_ids) and result.out_ids[position] == msg_id:
                    emitted.append({c: result.outputs[c][position] for c in columns})
                    position += 1
                outcome.records[msg_id] = (kind, emitted)
        outcome.states[number] = dict(state.states)
    return outcome
