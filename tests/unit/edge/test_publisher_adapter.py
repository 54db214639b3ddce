"""Publisher adapters in failover mode: only the elected one writes, in transactions a new
active fences, and a new active resumes right after the last line committed
(twinstream.edge.publisher). Kafka is a fake with transactions and fencing; the source is
a real file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from twinstream.edge.publisher import (
    SEQ_HEADER,
    SOURCE_HEADER,
    PublisherAdapter,
    ResumePoint,
)
from twinstream.edge.sources import FileSource, Line, Position
from twinstream.platform.settings import load_settings

TOPICS = load_settings(pipeline="hostmetrics").topics()


class Cluster:
    """The inbound topic's committed records and the shared transactional id's epoch."""

    def __init__(self) -> None:
        self.committed: list[tuple[bytes, bytes | None, dict[str, str]]] = []
        self.epoch = 0

    def resume(self) -> ResumePoint:
        best = ResumePoint()
        for _value, _key, headers in self.committed:
            seq = int(headers[SEQ_HEADER])
            if seq > best.seq:
                best = ResumePoint(Position.parse(headers[SOURCE_HEADER]), seq)
        return best

    def producer(self) -> Producer:
        return Producer(self)


class Producer:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.epoch = -1
        self.pending: list[tuple[bytes, bytes | None, dict[str, str]]] = []

    def init_transactions(self, timeout: float) -> None:
        self.cluster.epoch += 1
        self.epoch = self.cluster.epoch

    def begin_transaction(self) -> None:
        self.pending = []

    def produce(
        self, topic: str, *, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        assert topic == "hostmetrics.in"
        self.pending.append((value, key, {k: v.decode() for k, v in headers}))

    def commit_transaction(self, timeout: float) -> None:
        if self.epoch != self.cluster.epoch:
            raise KafkaException(KafkaError(KafkaError._FENCED, "producer fenced"))
        self.cluster.committed.extend(self.pending)
        self.pending = []

    def abort_transaction(self, timeout: float) -> None:
        self.pending = []

    def poll(self, timeout: float) -> int:
        return 0


def adapter(
    name: str,
    path: Path,
    cluster: Cluster,
    on_idle: Callable[[PublisherAdapter], None],
    **kw: object,
) -> PublisherAdapter:
    made: list[PublisherAdapter] = []

    def sleep(_s: float) -> None:
        on_idle(made[0])

    def source(idle: Callable[[float], None]) -> FileSource:
        return FileSource(path, sleep=idle, header=path.suffix == ".csv")

    made.append(
        PublisherAdapter(
            name,
            TOPICS,
            source,
            cluster.producer,
            cluster.resume,
            key_field="host",
            sleep=sleep,
            **kw,  # type: ignore[arg-type]
        )
    )
    return made[0]


def lead(one: PublisherAdapter, epoch: int = 1) -> None:
    """As the election does, but on this thread: elected, publish until it steps down."""
    one._leading.set()
    one.publish(epoch)


def write_lines(path: Path, first: int, count: int) -> None:
    with open(path, "a") as out:
        for i in range(first, first + count):
            out.write(json.dumps({"host": f"h{i % 5}", "n": i}) + "\n")


def ns(cluster: Cluster) -> list[int]:
    return [json.loads(v)["n"] for v, _k, _h in cluster.committed]


def dies_at_third_commit(publisher: PublisherAdapter) -> None:
    """The adapter's kill -9: its third batch never commits, and it leads no more."""
    real_commit = publisher._commit
    commits: list[int] = []

    def commit_then_die() -> None:
        commits.append(1)
        if len(commits) == 3:
            publisher._leading.clear()
            publisher._batch.clear()
            raise RuntimeError("killed")
        real_commit()

    publisher._commit = commit_then_die  # type: ignore[method-assign]


def test_the_active_follows_a_growing_file_each_line_once_in_order(tmp_path):
    path = tmp_path / "in.jsonl"
    write_lines(path, 0, 30)
    cluster = Cluster()
    rounds = iter([lambda: write_lines(path, 30, 25), lambda: write_lines(path, 55, 5)])

    def idle(me: PublisherAdapter) -> None:
        step = next(rounds, None)
        if step is None:
            me._leading.clear()  # the test is over: step down
        else:
            step()

    one = adapter("p1", path, cluster, idle, max_batch=10)
    lead(one)
    assert ns(cluster) == list(range(60))
    headers = [h for _v, _k, h in cluster.committed]
    assert [int(h[SEQ_HEADER]) for h in headers] == list(range(1, 61))
    assert {h["publisher"] for h in headers} == {"p1"}
    assert cluster.committed[7][1] == b"h2"  # keyed by the pipeline's partition_by
    assert one.status.published == 60
    assert one.status.seq == 60


def test_a_new_active_resumes_right_after_the_last_committed_line(tmp_path):
    """The first active dies with a transaction half built (its lines in no commit): the
    next one fences, reads where the committed lines end, and goes on from there."""
    path = tmp_path / "in.jsonl"
    write_lines(path, 0, 100)
    cluster = Cluster()

    def die(me: PublisherAdapter) -> None:
        me._leading.clear()

    first = adapter("p1", path, cluster, die, max_batch=30)
    dies_at_third_commit(first)
    lead(first, epoch=1)
    assert ns(cluster) == list(range(60))

    write_lines(path, 100, 20)
    second = adapter("p2", path, cluster, die)
    lead(second, epoch=2)
    assert ns(cluster) == list(range(120))
    assert [int(h[SEQ_HEADER]) for _v, _k, h in cluster.committed] == list(range(1, 121))


def test_a_zombie_fenced_by_the_new_active_commits_nothing(tmp_path):
    path = tmp_path / "in.jsonl"
    write_lines(path, 0, 40)
    cluster = Cluster()
    zombie = adapter("p1", path, cluster, lambda me: me._leading.clear(), max_batch=10)
    # The zombie's producer is made and fenced in; then it pauses (SIGSTOP) past its session.
    zombie._producing = cluster.producer()
    zombie._producing.init_transactions(1)
    zombie._leading.set()

    successor = adapter("p2", path, cluster, lambda me: me._leading.clear())
    lead(successor, epoch=2)
    assert ns(cluster) == list(range(40))
    # SIGCONT: the zombie still has a batch to commit, under the old epoch.
    line = Line(b'{"host":"h9","n":999}', Position("in.jsonl", 1, "x", 1))
    zombie._batch = [(line, line.raw)]
    with pytest.raises(Exception, match="another adapter took over"):
        zombie._commit()
    assert ns(cluster) == list(range(40))


def test_csv_lines_are_typed_by_the_schema_and_a_line_not_utf8_is_published_as_it_is(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b"host,n,extra\nh1,1,x\nh2,2.5,y\n\xff\xfe,3,z\n")
    cluster = Cluster()
    one = adapter(
        "p1",
        path,
        cluster,
        lambda me: me._leading.clear(),
        csv_fields={"host": "string", "n": "bigint"},
    )
    lead(one)
    values = [v for v, _k, _h in cluster.committed]
    assert values[0] == b'{"host": "h1", "n": 1}'
    assert values[1] == b'{"host": "h2", "n": "2.5"}'  # a wrong type: the engines say so
    assert values[2] == b"\xff\xfe,3,z"  # dead-lettered by the engines, not dropped here


def test_commits_wait_while_zookeeper_is_away(tmp_path):
    path = tmp_path / "in.jsonl"
    write_lines(path, 0, 5)
    cluster = Cluster()
    one = adapter("p1", path, cluster, lambda me: me._leading.clear())
    one.on_connection(False)
    one._producing = cluster.producer()
    one._producing.init_transactions(1)
    one._leading.set()
    line = Line(b'{"host":"h1","n":1}', Position("in.jsonl", 1, "x", 1))
    one._batch = [(line, line.raw)]
    one._leading.clear()  # the session is lost before it comes back
    with pytest.raises(Exception, match="stepped down while ZooKeeper was away"):
        one._commit()
    assert cluster.committed == []


class Znodes:
    """The part of a kazoo client the status board uses, over a dict."""

    def __init__(self) -> None:
        self.nodes: dict[str, bytes] = {}
        self.client_id: object = (1, b"session")

    def create(self, path: str, data: bytes, ephemeral: bool, makepath: bool) -> None:
        from kazoo.exceptions import NodeExistsError

        assert ephemeral
        if path in self.nodes:
            raise NodeExistsError()
        self.nodes[path] = data

    def set(self, path: str, data: bytes) -> None:
        self.nodes[path] = data

    def set_async(self, path: str, data: bytes) -> None:
        self.nodes[path] = data

    def get_children(self, path: str) -> list[str]:
        return [p.rsplit("/", 1)[1] for p in self.nodes if p.rsplit("/", 1)[0] == path]

    def get(self, path: str) -> tuple[bytes, None]:
        return self.nodes[path], None


def test_each_adapter_says_how_it_stands_where_status_reads_it():
    from twinstream.edge.publisher import Status, StatusBoard

    zk = Znodes()
    assert StatusBoard.read(zk, TOPICS) == {}
    for name, role in (("p1", "active"), ("p2", "standby")):
        StatusBoard(zk, TOPICS, name).publish(Status(role=role, published=7))
    board = StatusBoard(zk, TOPICS, "p1")
    board.publish(Status(role="active", published=9, position="in.jsonl@1.x:90"))
    board.publish(Status(role="active", published=10, position="in.jsonl@1.x:100"))
    seen = StatusBoard.read(zk, TOPICS)
    assert sorted(seen) == ["p1", "p2"]
    assert (seen["p1"].role, seen["p1"].published, seen["p1"].position) == (
        "active",
        10,
        "in.jsonl@1.x:100",
    )
    assert seen["p2"].role == "standby"
    assert all(p.startswith("/twinstream/hostmetrics/publishers/status/") for p in zk.nodes)
