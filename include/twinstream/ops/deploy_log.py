"""The record of a pipeline's deploys (twinstream.ops.deploy), in ZooKeeper under
`/twinstream/<pipeline>/deploys`: one sequential znode per deploy, its Record as JSON, with
the pipeline's ACL.

Guarantee: a deploy's start (where its new logic began, per partition) is written once: a
deploy run again of the same version, not yet switched, continues the record it finds and
never writes another start. Read by `twinstream status` and the operator page
(twinstream.ops.overview), which show the last one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from twinstream.core.rows import positions_text
from twinstream.platform.settings import CommonSettings


@dataclass
class Record:
    """One deploy, as kept in ZooKeeper (DeployLog): the versions, where the new logic
    began in each partition (its first engine's state: `start`, and how it was built), and,
    once switched, the cutover: the last msg_id the old version published, per partition."""

    version: str
    previous: str
    started_at: str
    first_engine: str = ""
    rebuilt: str = ""
    start: dict[int, int] = field(default_factory=dict)
    snapshot: str = ""
    cutover: dict[int, int] = field(default_factory=dict)
    switched_at: str = ""
    takeover_s: float | None = None
    rolled_back: bool = False
    # The lead passed before the switch: the active was lost while the new version's
    # standby was the one to take over (twinstream.ops.deploy.run).
    unplanned: bool = False

    def as_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Record:
        raw = json.loads(data.decode())
        for name in ("start", "cutover"):
            raw[name] = {int(p): int(o) for p, o in raw.get(name, {}).items()}
        return cls(**raw)

    def text(self) -> str:
        """`2+bbb (from 1+aaa): new logic from msg_id 0:120, 1:98; version 1+aaa up to
        0:2,041, 1:1,977, 2+bbb after`."""
        parts = [f"{self.version} (from {self.previous})"]
        if self.start:
            parts.append(f"new logic from msg_id {positions_text(self.start)} ({self.rebuilt})")
        if self.cutover:
            parts.append(
                f"version {self.previous} up to msg_id {positions_text(self.cutover)}, "
                f"{self.version} after"
                + (" (unplanned: the active was lost)" if self.unplanned else "")
            )
        else:
            parts.append("not switched")
        return "; ".join(parts)


class DeployLog(Protocol):
    """The pipeline's deploys, newest last: `begin` records a deploy's start once (a
    second `begin` of the same deploy returns the first's record), `update` adds its later
    facts."""

    def last(self) -> tuple[str, Record] | None: ...
    def begin(self, record: Record) -> tuple[str, Record]: ...
    def update(self, node: str, record: Record) -> None: ...


class ZooKeeperDeployLog:
    """DeployLog under `/twinstream/<pipeline>/deploys`: one sequential znode per deploy
    (`deploy-0000000003`), its Record as JSON, with the pipeline's ACL. `begin` of a
    version whose last deploy is not switched yet continues that one: its start stays the
    one recorded."""

    def __init__(self, client: Any, path: str) -> None:
        self._client = client
        self._path = path

    def _children(self) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return sorted(self._client.get_children(self._path))
        except NoNodeError:
            return []

    def last(self) -> tuple[str, Record] | None:
        children = self._children()
        if not children:
            return None
        node = f"{self._path}/{children[-1]}"
        data, _ = self._client.get(node)
        return node, Record.from_json(data)

    def begin(self, record: Record) -> tuple[str, Record]:
        last = self.last()
        if last is not None and last[1].version == record.version and not last[1].cutover:
            return last
        self._client.ensure_path(self._path)
        node = self._client.create(f"{self._path}/deploy-", record.as_json(), sequence=True)
        return str(node), record

    def update(self, node: str, record: Record) -> None:
        self._client.set(node, record.as_json())


@contextlib.contextmanager
def zookeeper_log(settings: CommonSettings) -> Iterator[ZooKeeperDeployLog]:
    """The pipeline's DeployLog with its own ZooKeeper session, closed after."""
    from twinstream.core.election import zk_session

    with zk_session(settings.zookeeper()) as client:
        yield ZooKeeperDeployLog(client, settings.deploys_path)
