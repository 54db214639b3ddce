"""What an engine talks to: its ZooKeeper and Kafka clients, built once at the process's edge.

`EngineClients.from_settings` builds them from the settings (the Kafka credentials and the
ZooKeeper password are read there: twinstream.platform.connections); the engine is given
them, so a unit test gives it fakes. Building starts no thread and opens no connection
that the clients' libraries do not open lazily: the engine starts what runs
(`Engine.open`, the election on `start`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kazoo.client import KazooClient

from twinstream.core.agreement import DigestCost, PublishedRange
from twinstream.core.election import Election, Standing, ensure_chroot, root_acl, zk_client
from twinstream.core.outbound import (
    KafkaPublisher,
    LastPublishedReader,
    ProgressFollower,
    read_published_rows,
)
from twinstream.core.rows import Output
from twinstream.engine.positions import InboundWatermarks
from twinstream.platform import registry
from twinstream.platform.kafka import connection
from twinstream.platform.settings import EngineSettings
from twinstream.platform.versions import UNVERSIONED, CodeVersion


class ElectionFactory(Protocol):
    """An election of the pipeline's engines, given this engine's callbacks."""

    def __call__(
        self,
        *,
        on_elected: Callable[[int], None],
        on_step_down: Callable[[str], None],
        on_connection: Callable[[bool], None],
        standing: Callable[[], Standing],
        eligible: Callable[[], bool],
    ) -> Election: ...


@dataclass
class EngineClients:
    zk: KazooClient
    """The engine's ZooKeeper session: the election, the standings, the quarantine."""
    election: ElectionFactory
    ensure_chroot: Callable[[], None]
    """Creates the connect string's chroot if it is missing (before each start)."""
    watermarks: InboundWatermarks
    """The inbound topic's high watermarks and log starts: the lag, restores, repairs."""
    arrival_marks: InboundWatermarks
    """The arrival sampler's own consumer (a thread of its own: never shared)."""
    last_published: LastPublishedReader
    """Where the published output ends, read at a takeover (and at a start, before the
    engine contends): built ahead, so that a win pays no client's bootstrap."""
    active_position: LastPublishedReader
    """The same for a standby's periodic look: a takeover never waits behind it."""
    follower: ProgressFollower
    """The progress topic as the active writes it (the agreement check)."""
    publisher: Callable[[DigestCost], KafkaPublisher]
    """A new fencing publisher (a takeover's), counting its digests' cost in the one given."""
    published_rows: Callable[[PublishedRange], list[Output]]
    """The active's rows of a range, read back from the topics (a disagreement's detail)."""
    version: CodeVersion = UNVERSIONED
    """The code the engine loaded (twinstream.platform.versions), fixed for its life."""
    code_on_disk: Callable[[], str] = lambda: ""
    """The digest of the pipeline's code on disk now ("" when unknown): whether the engine
    still runs what its pipeline's files hold."""

    @classmethod
    def from_settings(
        cls, settings: EngineSettings, engine_id: str, version: CodeVersion = UNVERSIONED
    ) -> EngineClients:
        kafka = connection(settings)
        topics = settings.topics()
        zookeeper = settings.zookeeper()
        zk = zk_client(zookeeper)
        acl = root_acl(zookeeper)
        return cls(
            zk=zk,
            election=functools.partial(
                Election,
                zk,
                settings.election_path,
                settings.epoch_path,
                engine_id,
                root_acl=acl,
                # A win goes on to an engine more than a batch (in_sync_lag) more caught up:
                # a takeover then never waits for a restoring or cold engine to catch up.
                prefer_margin=settings.in_sync_lag,
            ),
            ensure_chroot=lambda: ensure_chroot(zookeeper, acl),
            watermarks=InboundWatermarks(kafka, topics, engine_id),
            arrival_marks=InboundWatermarks(kafka, topics, engine_id),
            last_published=LastPublishedReader(kafka, topics),
            active_position=LastPublishedReader(kafka, topics),
            follower=ProgressFollower(kafka, topics, engine_id),
            publisher=lambda digests: KafkaPublisher(
                kafka,
                topics,
                engine_id,
                settings.max_message_bytes,
                digest_cost=digests,
                version=str(version),
            ),
            published_rows=lambda r: read_published_rows(kafka, topics, r),
            version=version,
            code_on_disk=lambda: registry.code_digest(settings),
        )
