"""Which code an engine runs: its pipeline's declared version and the digest of its code,
on its GET /server and /metrics and in a header of every record it publishes; a change of
the pipeline's files while it runs is seen, never taken on silently (issue 51, point 1).
A standby on new code beside the active on the old is a shadow: what differs is reported,
and it is neither barred nor restored for it (issue 51, point 3). A deploy brings every
engine to the code on disk with the lead switched at one msg_id per partition (points 2
and 4)."""

from __future__ import annotations

import collections
import json
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from devkit.harness import Pipeline, coverage, wait_for
from twinstream.engine.api import EngineApi
from twinstream.ops import deploy, deploy_log
from twinstream.ops.drill import KafkaEpochTail
from twinstream.platform import registry
from twinstream.platform.versions import digest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]

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


def _package(stack_env: dict[str, str], code: str) -> tuple[str, Path]:
    """A pipeline package beside the stack's pipelines file, whose folder the engines put
    on the path: (its name, its folder)."""
    package = f"versioned_{uuid.uuid4().hex[:8]}"
    folder = Path(stack_env["TWINSTREAM_PIPELINES_FILE"]).parent / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "pipeline.py").write_text(code)
    return package, folder


def test_an_engine_says_which_code_it_runs_stamps_its_output_and_sees_a_change_on_disk(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    package, folder = _package(stack_env, VERSIONED)
    loaded = f"1+{digest(folder)}"
    p = Pipeline(stack_env, tmp_path / "pipeline", engine_ids=("a",), module=f"{package}.pipeline")
    try:
        a = p.start("a")
        p.wait_running(a)
        server = a.get("/server")
        assert (server["pipeline_version"], server["stale"]) == (loaded, False)
        p.join_load(p.load(300, rate=0))
        p.wait_published(299)
        outputs, progress = p.outputs(), p.progress()
        assert outputs
        assert progress
        assert {r.version for r in outputs} == {loaded}
        assert {r.version for r in progress} == {loaded}

        # The owner edits the code: the engine keeps what it loaded, and says so.
        (folder / "pipeline.py").write_text(VERSIONED + "\n# a 20-minute session gap\n")
        server = a.get("/server")
        assert server["pipeline_version"] == loaded
        assert server["stale"] is True
        assert server["code_on_disk"] == digest(folder) != loaded.split("+")[1]
        wait_for(
            lambda: (
                "twinstream_code_stale{" in a.get_text("/metrics")
                and f'version="{loaded}"' in a.get_text("/metrics")
            ),
            30,
            "the stale code and the version in /metrics",
        )
        stale = [
            line
            for line in a.get_text("/metrics").splitlines()
            if line.startswith("twinstream_code_stale{")
        ]
        assert stale
        assert stale[0].endswith(" 1.0")
    finally:
        p.discard()


def test_a_standby_on_new_code_is_a_shadow_never_barred_and_may_take_over_exactly_once(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    old, old_folder = _package(stack_env, VERSIONED)
    new, new_folder = _package(stack_env, CHANGED)
    v1, v2 = f"1+{digest(old_folder)}", f"2+{digest(new_folder)}"
    p = Pipeline(stack_env, tmp_path / "pipeline", module=f"{old}.pipeline")
    try:
        a, b = p.start_pair({}, {"TWINSTREAM_PIPELINE_MODULE": f"{new}.pipeline"})
        assert (a.get("/server")["pipeline_version"], b.get("/server")["pipeline_version"]) == (
            v1,
            v2,
        )
        load = p.load(3_000, rate=500)

        def differences() -> dict[str, Any] | None:
            agreement = b.get("/pipeline")["agreement"]
            shadow = agreement.get("shadow") or {}
            return agreement if shadow.get("examples") else None

        agreement = wait_for(differences, 90, "engine b's shadow to report a difference")
        assert agreement["state"] == "shadow"
        shadow = agreement["shadow"]
        assert (shadow["active_version"], shadow["version"]) == (v1, v2)
        assert 0 < shadow["ranges_differing"] <= shadow["ranges_compared"]
        assert shadow["msg_ids_differing"] > 0
        example = shadow["examples"][0]
        assert [r["value"] for r in example["active_rows"]] != [
            r["value"] for r in example["engine_rows"]
        ]
        assert all('"v": 2' in r["value"] for r in example["engine_rows"])
        assert b.role() == "standby"  # never barred: it takes part in the election

        # The old version's engine dies: the new one leads, at a transaction boundary.
        a.kill9()
        wait_for(lambda: b.role() == "active", 30, "engine b, on the new code, active")
        p.join_load(load)
        end = p.produced
        p.wait_published(end - 1)
        missing, duplicated = coverage(p.progress(), end)
        assert (missing, duplicated) == ([], [])
        # One switch per partition: version 1 up to a msg_id, version 2 after it.
        outputs = sorted((r.partition, r.msg_id or 0, r.version) for r in p.outputs())
        for partition in {r[0] for r in outputs}:
            versions = [v for part, _, v in outputs if part == partition]
            switch = versions.index(v2) if v2 in versions else len(versions)
            assert set(versions[:switch]) <= {v1}
            assert set(versions[switch:]) == {v2}
    finally:
        p.discard()


# The new version's own test, beside its code: the deploy runs it first.
V2_TEST = """from {package}.pipeline import pipeline


def test_it_is_version_2():
    assert pipeline.version == "2"
"""


def wait_published(p: Pipeline, ends: Mapping[int, int]) -> None:
    """Until the active has published every partition's last inbound msg_id."""

    def done() -> bool:
        active = p.active()
        if active is None:
            return False
        published = {int(q): m for q, m in active.get("/pipeline")["published"].items()}
        return all(published.get(q, -1) >= end - 1 for q, end in ends.items() if end)

    wait_for(done, 120, f"every partition published up to {dict(ends)}", every_s=0.5)


class Engines(Mapping[str, EngineApi]):
    """The pipeline's engines' admin APIs as they are now: a restarted engine is a new
    process with a client of its own."""

    def __init__(self, p: Pipeline) -> None:
        self._p = p

    def __getitem__(self, engine_id: str) -> EngineApi:
        return self._p.engines[engine_id].client

    def __iter__(self) -> Iterator[str]:
        return iter(self._p.engines)

    def __len__(self) -> int:
        return len(self._p.engines)


class Processes:
    """The harness's engine processes: stopped by pid (SIGTERM, awaited), started on the
    code on disk and awaited until their admin API answers."""

    def __init__(self, p: Pipeline) -> None:
        self._p = p

    def stop(self, engine_id: str) -> None:
        self._p.engines[engine_id].stop()

    def start(self, engine_id: str) -> None:
        engine = self._p.start(engine_id)
        wait_for(lambda: engine.try_get("/server"), 120, f"engine {engine_id} answering")
        engine.remember_tree()


def test_a_deploy_switches_the_lead_to_the_new_version_at_one_msg_id_per_partition(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    """Version 1 active and standby under 300 events/s; version 2 written over it on disk
    (same state, another output) with its own test. The deploy: tests, the standby on
    version 2 from its checkpoint, a snapshot of it, the switch, the old active on version 2
    from that snapshot. Every inbound offset is published once; every output up to the
    cutover of its partition is version 1's as a reference run of version 1 gives it, every
    one after it version 2's as a reference run of version 2 gives it; the headers say
    which."""
    package, folder = _package(stack_env, VERSIONED)
    reference_package, _ = _package(stack_env, CHANGED)
    v1 = f"1+{digest(folder)}"
    p = Pipeline(stack_env, tmp_path / "pipeline", module=f"{package}.pipeline", partitions=3)
    try:
        p.start_pair()
        load = p.load(200_000, rate=300)
        wait_for(lambda: load.sent > 1_500, 60, "input flowing")
        # The owner's change: version 2, and its test.
        (folder / "pipeline.py").write_text(CHANGED)
        (folder / "test_pipeline.py").write_text(V2_TEST.format(package=package))
        target = deploy.target_on_disk(p.settings)
        v2 = target.version
        assert v2 == f"2+{digest(folder)}" != v1
        lines: list[str] = []
        with deploy_log.zookeeper_log(p.settings) as log:
            d = deploy.Deployment(
                pipeline=p.settings.pipeline,
                engines=Engines(p),
                processes=Processes(p),
                deploys=log,
                progress=deploy.KafkaProgressMarks(p.settings),
                checkpoint_at=lambda e: deploy.checkpoint_at(p.settings, e),
                set_aside=lambda e: deploy.set_aside(p.settings, e),
                run_tests=lambda: deploy.pipeline_tests(p.settings, skip=False),
                replay_problem=lambda: deploy.replay_problem(p.settings),
                tail=lambda: KafkaEpochTail(p.settings),
                confirm=lambda question: True,
                echo=lines.append,
                wait_s=240,
            )
            record = deploy.run(d, target)
            assert log.last() is not None
            assert log.last()[1] == record  # type: ignore[index]
        said = "\n".join(lines)
        assert "ranges differ" in said, said  # the shadow's summary, before the switch
        assert (record.version, record.previous, record.rebuilt) == (v2, v1, "checkpoint")
        assert sorted(record.cutover) == [0, 1, 2]
        assert record.takeover_s is not None
        assert record.takeover_s < 10
        for engine in p.engines.values():
            assert engine.get("/server")["pipeline_version"] == v2
        # Output of version 2 after the switch, then the load ends.
        wait_for(lambda: len(p.outputs()) > 0, 30, "output")
        p.stop_load(load)
        ends = p.inbound_ends()
        wait_published(p, ends)

        # Exactly once, per partition, by the progress topic.
        counts: collections.Counter[tuple[int, int]] = collections.Counter()
        for r in p.progress():
            span = json.loads(r.value)
            counts.update((r.partition, i) for i in range(span["first"], span["last"] + 1))
        wanted = {(q, i) for q, end in ends.items() for i in range(end)}
        assert sorted(wanted - set(counts))[:10] == []
        assert sorted(k for k, c in counts.items() if c > 1)[:10] == []

        # Each output as its own version's reference run gives it, and says its version.
        old_rows = p.reference_by_position()
        p.contract = registry.load(
            p._settings(TWINSTREAM_PIPELINE_MODULE=f"{reference_package}.pipeline")
        )
        new_rows = p.reference_by_position()
        s = p.settings
        got: dict[tuple[int, int], list[tuple[str, str | None, str, str | None]]] = {}
        for r in sorted(p.outputs(), key=lambda r: (r.topic, r.partition, r.offset)):
            assert r.msg_id is not None
            got.setdefault((r.partition, r.msg_id), []).append((r.topic, r.key, r.value, r.version))
        assert set(old_rows) == wanted
        switched = 0
        for position in sorted(wanted):
            partition, msg_id = position
            after = msg_id > record.cutover[partition]
            switched += after
            rows, version = (new_rows, v2) if after else (old_rows, v1)
            want = [
                (s.outbound_topic if o.kind == "out" else s.dlq_topic, o.key, o.value, version)
                for o in rows[position]
            ]
            assert got.get(position, []) == want, (position, record.cutover)
        assert switched > 300  # version 2 published a good share of the input
    finally:
        p.discard()
