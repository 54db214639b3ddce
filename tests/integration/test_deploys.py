"""A running pipeline's code changed under load with `twinstream deploy`'s steps (issue 51,
points 2, 4 and 5), on real ZooKeeper, Kafka and Spark, its engines its own, stopped by pid:
a deploy whose state keeps its shape, its rollback, and a deploy whose state's shape changed
(a replay of the retained input). Each output is checked against a plain-Python reference
run of the version its header names, and each deploy's switch against its cutover msg_id
per partition.

The three deploys follow one another on one pipeline (two partitions, a pair under 100
events/s while each runs), each a module fixture built on the one before (`deployed`,
`rolled_back`, `reshaped`): a rollback needs a deploy to go back from, and sharing the
pair spares every test an engine pair's start and its catch-up. A fixture keeps what its
deploy saw (the record, the progress lines, each engine's version, the positions published
by then); the test of each deploy asserts on it, so any test runs alone (its fixtures
first) or in any order.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devkit.harness import Pipeline, wait_for
from devkit.pace import bound
from tests.integration.engines import assert_tiled_once
from tests.integration.versioned import CHANGED, RESHAPED, VERSIONED, versioned_package
from twinstream.engine.api import EngineApi
from twinstream.ops import deploy, deploy_log
from twinstream.ops.deploy_log import Record
from twinstream.ops.drill import KafkaEpochTail
from twinstream.platform import registry
from twinstream.platform.kafka import admin_config
from twinstream.platform.versions import digest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]

# Each version's own test, beside its code: the deploy runs it first.
VERSION_TEST = """from {package}.pipeline import pipeline


def test_it_is_version_{n}():
    assert pipeline.version == "{n}"
"""

# Every restart catches up what arrived meanwhile, on two cores beside the other JVM: a
# low rate keeps each deploy within a minute or two.
RATE = 100


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


def deployment(
    p: Pipeline, log: deploy_log.ZooKeeperDeployLog, lines: list[str]
) -> deploy.Deployment:
    """`twinstream deploy --yes`'s steps on the harness's engines; each line it says kept
    with the seconds since it began (a failure shows where the deploy's time went)."""
    began = time.monotonic()
    return deploy.Deployment(
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
        echo=lambda line: lines.append(f"{time.monotonic() - began:7.1f} s  {line}"),
        wait_s=240,
    )


@dataclass(frozen=True)
class Deployed:
    """What one deploy under load saw: its record, its progress lines, every engine's
    version once it ended, and every inbound position published exactly once by then."""

    record: Record
    lines: list[str]
    versions: dict[str, str]
    wanted: set[tuple[int, int]]

    @property
    def said(self) -> str:
        return "\n".join(self.lines)


@dataclass
class VersionedPipeline:
    """A pipeline of two partitions whose code lives in a package of its own (`folder`),
    and each version's code in a package of its own for its reference run."""

    p: Pipeline
    package: str
    folder: Path
    references: dict[str, str]  # version -> the module of a package holding its code

    def write(self, code: str, n: int) -> str:
        """Version `n`'s code and its test on disk, as the owner writes them; its version
        as the deploy reads it, whose reference run is `code` in a package of its own."""
        (self.folder / "pipeline.py").write_text(code)
        (self.folder / "test_pipeline.py").write_text(
            VERSION_TEST.format(package=self.package, n=n)
        )
        version = deploy.target_on_disk(self.p.settings).version
        assert version == f"{n}+{digest(self.folder)}"
        reference, _ = versioned_package(self.p.env, code)
        self.references.setdefault(version, f"{reference}.pipeline")
        return version

    def deploy_under_load(self, rollback: bool = False) -> Deployed:
        """Deploy the code on disk (--yes, or --rollback) while RATE events/s arrive; once
        the new version has published, the load stops and everything is published."""
        p = self.p
        lines: list[str] = []
        load = p.load(10**6, rate=RATE)
        try:
            wait_for(lambda: load.sent > 500, 60, "input flowing")
            with deploy_log.zookeeper_log(p.settings) as log:
                record = deploy.run(
                    deployment(p, log, lines), deploy.target_on_disk(p.settings), rollback=rollback
                )
                last = log.last()
                assert last is not None
                assert last[1] == record
            published = len(p.outputs())
            wait_for(lambda: len(p.outputs()) > published, 60, "output after the deploy")
        finally:
            p.stop_load(load)
            print("\n".join(lines))  # where the deploy's time went (pytest -s, a failure)
        versions = {e: engine.get("/server")["pipeline_version"] for e, engine in p.engines.items()}
        ends = p.inbound_ends()
        # The active knows every partition published (the harness's own wait).
        p.wait_caught_up(wait_for(p.active, 30, "an active"), field="published", timeout_s=120)
        return Deployed(record, lines, versions, assert_tiled_once(p, ends))

    def assert_rows_by_version(
        self, wanted: set[tuple[int, int]], version_at: Callable[[int, int], str]
    ) -> collections.Counter[str]:
        """Each output at the positions `wanted` as the reference run of the version
        `version_at(partition, msg_id)` names gives it, with that version in its header.
        Returns the outputs' count per version."""
        p = self.p
        rows = {}
        for version, module in self.references.items():
            p.contract = registry.load(p._settings(TWINSTREAM_PIPELINE_MODULE=module))
            rows[version] = p.reference_by_position()
            assert wanted <= set(rows[version])
        s = p.settings
        got: dict[tuple[int, int], list[tuple[str, str | None, str, str | None]]] = {}
        for r in sorted(p.outputs(), key=lambda r: (r.topic, r.partition, r.offset)):
            assert r.msg_id is not None
            got.setdefault((r.partition, r.msg_id), []).append((r.topic, r.key, r.value, r.version))
        per_version: collections.Counter[str] = collections.Counter()
        for position in sorted(wanted):
            version = version_at(*position)
            per_version[version] += 1
            want = [
                (s.outbound_topic if o.kind == "out" else s.dlq_topic, o.key, o.value, version)
                for o in rows[version][position]
            ]
            assert got.get(position, []) == want, (position, version)
        return per_version


@pytest.fixture(scope="module")
def versioned(stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """Version 1 of the example, a pair of engines on it, both warm."""
    package, folder = versioned_package(stack_env, VERSIONED)
    (folder / "test_pipeline.py").write_text(VERSION_TEST.format(package=package, n=1))
    p = Pipeline(
        stack_env, tmp_path_factory.mktemp("deploys"), module=f"{package}.pipeline", partitions=2
    )
    v1 = f"1+{digest(folder)}"
    try:
        p.start_pair()
        yield VersionedPipeline(p, package, folder, {v1: f"{package}.pipeline"})
    finally:
        p.discard()


@pytest.fixture(scope="module")
def deployed(versioned: VersionedPipeline) -> Deployed:
    """Version 2 (the same state, another output) deployed over version 1 under load."""
    versioned.write(CHANGED, 2)
    return versioned.deploy_under_load()


@pytest.fixture(scope="module")
def rolled_back(versioned: VersionedPipeline, deployed: Deployed) -> Deployed:
    """Version 1's code put back on disk (git checkout) and `deploy --rollback` under load."""
    versioned.write(VERSIONED, 1)
    return versioned.deploy_under_load(rollback=True)


@pytest.fixture(scope="module")
def reshaped(versioned: VersionedPipeline, rolled_back: Deployed) -> Deployed:
    """Version 3 (another state shape) deployed under load: its first engine replays."""
    versioned.write(RESHAPED, 3)
    return versioned.deploy_under_load()


def test_a_deploy_switches_the_lead_to_the_new_version_at_one_msg_id_per_partition(
    versioned: VersionedPipeline, deployed: Deployed
) -> None:
    """Version 1 active and standby under load; version 2 written over it on disk (same
    state, another output) with its own test. The deploy: tests, the standby on version 2
    from its checkpoint, a snapshot of it, the shadow's summary, the switch, the old active
    on version 2 from that snapshot. Every inbound offset is published once; every output
    up to the cutover of its partition is version 1's as its reference run gives it, every
    one after version 2's as version 2's reference run gives it; the headers say which."""
    record = deployed.record
    v1, v2 = record.previous, record.version
    assert v1 != v2
    assert "ranges differ" in deployed.said, deployed.said  # the shadow's, before the switch
    assert record.rebuilt == "checkpoint"
    assert sorted(record.cutover) == [0, 1], deployed.said
    assert record.takeover_s is not None, deployed.said
    assert record.takeover_s < bound(10), (record.takeover_s, bound(10))
    assert set(deployed.versions.values()) == {v2}, deployed.versions
    print(f"deployed {v2}: takeover {record.takeover_s:.2f} s, cutover {record.cutover}")

    per_version = versioned.assert_rows_by_version(
        deployed.wanted,
        lambda partition, msg_id: v2 if msg_id > record.cutover[partition] else v1,
    )
    assert per_version[v2] > 300, per_version  # version 2 published a good share


def test_a_rollback_under_load_returns_the_lead_to_the_version_before_exactly_once(
    versioned: VersionedPipeline, deployed: Deployed, rolled_back: Deployed
) -> None:
    """After version 2's deploy, version 1's code put back and `deploy --rollback`: the
    lead passes back to version 1 at a second cutover per partition. Every inbound offset
    is published once; outputs up to the first cutover and after the second are version 1's
    as its reference run gives them (its state went on through version 2, whose state is
    the same), those between version 2's; the log records the rollback."""
    forward, back = deployed.record, rolled_back.record
    v1, v2 = forward.previous, forward.version
    assert (back.version, back.previous, back.rolled_back) == (v1, v2, True)
    assert sorted(back.cutover) == [0, 1], rolled_back.said
    assert all(back.cutover[q] > forward.cutover[q] for q in (0, 1)), (forward, back)
    assert back.takeover_s is not None, rolled_back.said
    assert back.takeover_s < bound(10), (back.takeover_s, bound(10))
    assert set(rolled_back.versions.values()) == {v1}, rolled_back.versions

    def version_at(partition: int, msg_id: int) -> str:
        return v2 if forward.cutover[partition] < msg_id <= back.cutover[partition] else v1

    per_version = versioned.assert_rows_by_version(rolled_back.wanted, version_at)
    assert per_version[v2] > 100, per_version
    after = sum(msg_id > back.cutover[partition] for partition, msg_id in rolled_back.wanted)
    assert after > 100, "version 1 published little after the rollback"


def test_a_deploy_that_changes_the_states_shape_replays_the_retained_input_exactly_once(
    versioned: VersionedPipeline, deployed: Deployed, rolled_back: Deployed, reshaped: Deployed
) -> None:
    """Version 3 keeps another state (a count per host beside its window): its first engine
    rebuilds it by replaying the retained inbound topic from a window back (here every
    record: all arrived within the hour), the later one restores a snapshot of it. Every
    inbound offset is published once, and every output after version 3's cutover is what
    its reference run over the whole input gives (the count of every earlier record of its
    host, whichever version computed that record's output)."""
    forward, back, record = deployed.record, rolled_back.record, reshaped.record
    v1, v2, v3 = forward.previous, forward.version, record.version
    assert record.previous == v1
    assert record.rebuilt == "replay"
    assert record.start == {0: 0, 1: 0}, record.start  # a window back: every record
    assert "replays the retained input" in reshaped.said, reshaped.said
    assert sorted(record.cutover) == [0, 1], reshaped.said
    assert all(record.cutover[q] > back.cutover[q] for q in (0, 1)), (back, record)
    assert record.takeover_s is not None, reshaped.said
    assert record.takeover_s < bound(10), (record.takeover_s, bound(10))
    assert set(reshaped.versions.values()) == {v3}, reshaped.versions

    def version_at(partition: int, msg_id: int) -> str:
        if msg_id > record.cutover[partition]:
            return v3
        return v2 if forward.cutover[partition] < msg_id <= back.cutover[partition] else v1

    per_version = versioned.assert_rows_by_version(reshaped.wanted, version_at)
    assert per_version[v3] > 100, per_version


def test_a_replay_that_the_inbound_retention_no_longer_reaches_is_named_with_the_fix(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    """What a deploy of a changed state shape asks before it restarts anything (the refusal
    itself, with nothing restarted, is tests/unit/ops/test_deploy.py's): on real Kafka, a
    topic that holds every record of the window reaches; once Kafka has deleted the
    window's first records, the reason names where the log begins and the fix."""
    p = Pipeline(stack_env, tmp_path, engine_ids=("a",))
    p.join_load(p.load(200, rate=0))
    assert deploy.replay_problem(p.settings) is None
    admin = AdminClient(admin_config(p.settings))
    (future,) = admin.delete_records([TopicPartition(p.settings.inbound_topic, 0, 50)]).values()
    future.result()
    problem = deploy.replay_problem(p.settings)
    assert problem is not None
    assert f"Kafka's log of {p.settings.inbound_topic} begins at inbound offset 50" in problem
    assert "TWINSTREAM_WINDOW_RETENTION_MS" in problem
    assert "Raise the topic's retention.ms" in problem
