"""Leader election of a pipeline's engines through ZooKeeper, in kazoo's recipe style.

Guarantee: at most one engine at a time runs `on_elected` while its session is connected;
the lowest ephemeral sequential node under the election path wins, every other contender
watches its predecessor, so a dead active's successor learns of it when the session
expires (about 1 s with tickTime 500). While the session is SUSPENDED the engine must not
commit (`on_connection(False)`); on LOST its node is gone, so it steps down and enters the
election again with a new node. Kafka fencing (the shared transactional id) covers the
window in which an old active has not yet heard that its session is gone.

Each win increments a counter znode: the epoch, written into every published record.

Guarantee (preference): a contender that wins while it is not in sync (cold, restoring,
catching up) and another live engine says it is, or while it is more than a batch behind an
in-sync one, hands the win on before it takes an epoch or fences anything: it leaves the
lock and queues again, so the most caught-up in-sync engine leads. Each engine says how it
stands in an ephemeral znode (`publish_standing`), gone with its session like its lock node,
so a dead engine is never preferred. Handing on is bounded (MAX_HAND_ONS within
HAND_ON_WINDOW_S): an engine that says it is in sync but does not contend cannot keep the
pipeline without an active.
Clients authenticate by SASL (DIGEST-MD5, no password on the wire) and every znode carries
an ACL for Twinstream's user alone: others can neither read, create nor delete them. A node
Twinstream needs that someone else created is refused with the fix (`check_owned`).

Guarantee (eligibility): an engine that may not lead (`eligible` says no: its output
disagrees with the active's, twinstream.core.agreement) never takes an epoch: it leaves the
queue, gives up a win it had queued for before it takes an epoch, and enters again only once
it may lead (restored, or overridden). No winner hands its win to such an engine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.hosts import collect_hosts
from kazoo.protocol.states import KeeperState
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL, Permissions, make_acl

from twinstream.platform.connections import ZooKeeperConnection

log = logging.getLogger(__name__)


def zk_client(zk: ZooKeeperConnection, **overrides: Any) -> KazooClient:
    options: dict[str, Any] = {
        "hosts": zk.hosts,
        # Asks for the smallest session ZooKeeper grants (2 x tickTime): fast detection.
        "timeout": zk.session_timeout_s,
        # SASL DIGEST-MD5 is a challenge and response: the password never crosses the wire
        # (the digest scheme's addauth sends it in clear). ZooKeeper refuses every request of
        # a session that has not authenticated this way (enforce.auth, stack/render.py).
        "sasl_options": {
            "mechanism": "DIGEST-MD5",
            "username": zk.user,
            "password": zk.password,
        },
        "default_acl": [owner_acl(zk)],
        # Keep reconnecting forever: an engine outlives ZooKeeper restarts.
        "connection_retry": {"max_tries": -1, "delay": 0.2, "max_delay": 2.0},
    }
    return KazooClient(**{**options, **overrides})


class ZooKeeperUnreachable(RuntimeError):
    """A short-lived session (an operator's command, a DAG task) found no ZooKeeper."""


@contextlib.contextmanager
def zk_session(
    zk: ZooKeeperConnection,
    timeout_s: float = 15.0,
    client_of: Callable[[ZooKeeperConnection], KazooClient] | None = None,
) -> Iterator[KazooClient]:
    """A started client for one command's work, stopped and closed after. A ZooKeeper
    that does not answer within `timeout_s` is a ZooKeeperUnreachable that names its hosts
    and the fix, not kazoo's bare timeout (a command's traceback said only "Connection
    time-out")."""
    from kazoo.handlers.threading import KazooTimeoutError

    client = (client_of or zk_client)(zk)
    try:
        client.start(timeout=timeout_s)
    except KazooTimeoutError:
        client.stop()
        client.close()
        raise ZooKeeperUnreachable(
            f"ZooKeeper at {zk.hosts} did not answer within {timeout_s:.0f} s: is the stack "
            "running? (`make status` says; `make up` starts it, TWINSTREAM_ZK_CONNECT "
            "names another ensemble)"
        ) from None
    try:
        yield client
    finally:
        client.stop()
        client.close()


ROOT = "/twinstream"
# A client to start: never started or stopped (CLOSED), or given up on by kazoo
# (AUTH_FAILED: a SASL handshake cut short, see Election._revive). Any other state is a
# session kazoo is keeping or reconnecting (after an expired one, it makes a new one).
_STARTABLE = (KeeperState.CLOSED, KeeperState.AUTH_FAILED)
# How often a claim of the nodes tries through dropped connections, waiting 0.1 s, then
# twice as long each time up to 2 s: about 30 s in all, by when a session of the stack's
# (at most 30 s) has expired and the election's own handling takes over.
CLAIM_TRIES = 20


def owner_acl(zk: ZooKeeperConnection) -> ACL:
    """Everything, to Twinstream's ZooKeeper user (as SASL authenticates it), and nobody
    else: every node Twinstream creates carries this ACL alone."""
    return make_acl("sasl", zk.user, all=True)


def root_acl(zk: ZooKeeperConnection) -> list[ACL]:
    """/twinstream (and a chroot): Twinstream's user alone may list it or create a pipeline
    under it; ZooKeeper has no per-name CREATE, so a CREATE for anyone else would let them
    take any pipeline's name first and lock its engines out."""
    return [owner_acl(zk)]


class ForeignNodeError(RuntimeError):
    """A node Twinstream needs exists with an ACL Twinstream did not give it."""


def check_owned(client: KazooClient, path: str, expected: list[ACL]) -> None:
    """Guarantee: returns only if `path` is missing or carries exactly `expected`; a node
    made by someone else (another ACL, or one we may not even read) raises ForeignNodeError
    naming the fix, so that an engine never runs on nodes another client controls."""
    try:
        acl, _stat = client.get_acls(path)
    except NoNodeError:
        return
    except NoAuthError:
        acl = None
    want = {(a.perms, a.id.scheme, a.id.id) for a in expected}
    if acl is not None and {(a.perms, a.id.scheme, a.id.id) for a in acl} == want:
        return
    shown = "not readable by us" if acl is None else ", ".join(_acl_text(a) for a in acl)
    raise ForeignNodeError(
        f"ZooKeeper node {path} was not created by Twinstream's ZooKeeper user: its ACL is "
        f"{shown}, expected {', '.join(_acl_text(a) for a in expected)}. Whoever made it "
        "could read or block the election, so the engines will not use it. Fix: find out who "
        "created it, delete it as ZooKeeper's super user (zkCli.sh deleteall "
        f"{path}), then start the engines again: they recreate it with their own ACL. "
        "`make up`'s own ZooKeeper has no super user: there, `make down`, delete "
        ".twinstream/zookeeper/data, and `make up` (every election starts afresh)"
    )


def _acl_text(acl: ACL) -> str:
    perms = "".join(
        letter
        for letter, bit in (
            ("r", Permissions.READ),
            ("w", Permissions.WRITE),
            ("c", Permissions.CREATE),
            ("d", Permissions.DELETE),
            ("a", Permissions.ADMIN),
        )
        if acl.perms & bit
    )
    return f"{acl.id.scheme}:{acl.id.id}:{perms}"


def ensure_chroot(zk: ZooKeeperConnection, acl: list[ACL]) -> None:
    """The connect string's chroot, created if missing (with `acl`, as /twinstream's): a
    client rooted there cannot create it (kazoo only warns that it is missing, and every
    create under it then fails). One someone else made is refused (check_owned)."""
    servers_and_ports, chroot = collect_hosts(zk.hosts)
    if not chroot:
        return
    servers = ",".join(f"{host}:{port}" for host, port in servers_and_ports)
    client = zk_client(zk, hosts=servers)
    try:
        client.start(timeout=30)
        if not client.exists(chroot):
            with contextlib.suppress(NodeExistsError):
                client.ensure_path(chroot, acl=acl)
        check_owned(client, chroot, acl)
    finally:
        client.stop()
        client.close()


@dataclass(frozen=True)
class Standing:
    """How far an engine is: in sync (twinstream.engine.readiness.InSync) and its lag;
    and whether it may lead at all (an engine whose output disagrees with the active's,
    twinstream.core.agreement, may not)."""

    in_sync: bool
    lag: int | None
    eligible: bool = True
    # The lag in seconds of the engine's own measured rate (None: not measured yet).
    lag_s: float | None = None

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "in_sync": self.in_sync,
                "lag": self.lag,
                "eligible": self.eligible,
                "lag_s": self.lag_s,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Standing | None:
        try:
            value = json.loads(data)
            lag, lag_s = value.get("lag"), value.get("lag_s")
            return cls(
                bool(value["in_sync"]),
                None if lag is None else int(lag),
                bool(value.get("eligible", True)),
                None if lag_s is None else float(lag_s),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def preferred_over(me: Standing, others: Mapping[str, Standing], margin: int) -> str | None:
    """The engine that should lead instead of one standing as `me`, or None.

    An in-sync engine is preferred to one that is not; among in-sync engines, one more than
    `margin` records (a batch) less behind. Engines that are not in sync are never preferred:
    after a double failure whoever wins first leads, the fastest way back to any output.
    Nor is one that may not lead (`eligible`: it disagrees with the active's output)."""
    in_sync = {e: s for e, s in others.items() if s.in_sync and s.eligible}
    if not in_sync:
        return None
    if not me.in_sync:
        return min(in_sync, key=lambda e: (in_sync[e].lag is None, in_sync[e].lag or 0, e))
    if me.lag is None:
        return None
    ahead = {e: s.lag for e, s in in_sync.items() if s.lag is not None and s.lag + margin < me.lag}
    return min(ahead, key=lambda e: (ahead[e], e)) if ahead else None


# A winner hands on at most this many times within the window, then leads whatever others
# say: a standing node outlives its engine's contention for a moment (its pipeline stopping).
MAX_HAND_ONS = 3
HAND_ON_WINDOW_S = 30.0


class Election:
    def __init__(
        self,
        client: KazooClient,
        path: str,
        epoch_path: str,
        identifier: str,
        on_elected: Callable[[int], None],
        on_step_down: Callable[[str], None],
        on_connection: Callable[[bool], None],
        sleep: Callable[[float], None] = time.sleep,
        root_acl: list[ACL] | None = None,
        standing: Callable[[], Standing] | None = None,
        prefer_margin: int = 0,
        clock: Callable[[], float] = time.monotonic,
        eligible: Callable[[], bool] | None = None,
    ) -> None:
        # How this engine stands now, asked on each win (None: never hand on).
        self._standing = standing
        # Whether this engine may lead now (None: always). One that may not stays out of
        # the queue until it may, and gives up a win it had queued for.
        self._eligible = eligible
        self._ineligible_said = False
        self._prefer_margin = prefer_margin
        self._clock = clock
        self._hand_ons: list[float] = []
        self._standing_path = posixpath.join(posixpath.dirname(path), "standing")
        # The session the standing node was created in (ephemeral: a new session needs a
        # new node).
        self._standing_session: Any = None
        self._root_acl = root_acl
        self._claimed = False
        self._client = client
        self._path = path
        self._epoch_path = epoch_path
        self._identifier = identifier
        self._on_elected = on_elected
        self._on_step_down = on_step_down
        self._on_connection = on_connection
        self._sleep = sleep
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._resign = threading.Event()
        # Set from winning until stepping down: a resign outside that would be stale by the
        # time this engine next wins, and would throw that leadership away at once.
        self._leading = threading.Event()
        self._thread: threading.Thread | None = None
        self._election: Any = None
        self.zk_state = "CLOSED"
        client.add_listener(self._listener)

    # Listeners run on kazoo's event thread and must not block: only flags and callbacks
    # that take the gate's lock briefly.
    def _listener(self, state: str) -> None:
        self.zk_state = str(state)
        if state == KazooState.SUSPENDED:
            log.warning("election %s: ZooKeeper SUSPENDED; commits held", self._identifier)
            self._on_connection(False)
        elif state == KazooState.CONNECTED:
            log.info("election %s: ZooKeeper CONNECTED", self._identifier)
            self._on_connection(True)
        elif state == KazooState.LOST:
            log.warning("election %s: ZooKeeper session LOST; stepping down", self._identifier)
            self._lost.set()
            self._on_step_down("ZooKeeper session lost")

    def start(self) -> None:
        """Enter the election (again, after a stop). The client is started only if it is
        not running (never started, stopped) or kazoo gave up on it (`_STARTABLE`): kazoo's
        `start` on a client that is reconnecting closes it first, joining its handler's
        threads, one of which may be running a state listener that waits for the caller
        (an engine's POST /pipeline/start entered while its session is SUSPENDED would hang
        for good). A reconnecting client is left to reconnect: the election waits for it."""
        self._stop.clear()
        if self._client.client_state in _STARTABLE:
            self._client.start(timeout=30)
        self.zk_state = str(self._client.state)
        self.claim()
        self._thread = threading.Thread(target=self._run, name=f"election-{self._identifier}")
        self._thread.daemon = True
        self._thread.start()

    def claim(self) -> None:
        """Make /twinstream and the pipeline's node if missing, with the root ACL, and raise
        ForeignNodeError if either exists with another ACL (someone else made it first).
        The pipeline's node is made here rather than on the way by the recipes, so that one
        someone else made is found before the engine reads or writes under it. Once it
        has succeeded it is not asked again (every query start, persist and recovery asks):
        nobody else may delete either node to make it anew."""
        if self._root_acl is None or self._claimed:
            return
        root_acl = self._root_acl
        home = posixpath.dirname(self._path)

        def claim_nodes() -> None:
            if not self._client.exists(ROOT):
                with contextlib.suppress(NodeExistsError):
                    self._client.create(ROOT, acl=root_acl)
            check_owned(self._client, ROOT, root_acl)
            # Not allowed even to look at a node someone else made: check_owned says so.
            with contextlib.suppress(NodeExistsError, NoAuthError):
                self._client.ensure_path(home, acl=root_acl)
            check_owned(self._client, home, root_acl)

        # A connection dropped meanwhile (a process starved of CPU misses its pings) is
        # tried again while kazoo reconnects within the session: a publisher adapter started
        # beside four engines' JVMs on two cores exited on one. Every step is idempotent.
        retry = KazooRetry(max_tries=CLAIM_TRIES, delay=0.1, max_delay=2.0, sleep_func=self._sleep)
        try:
            retry(claim_nodes)
        except RetryFailedError as exc:
            raise ConnectionLoss(
                f"election {self._identifier}: ZooKeeper did not answer {CLAIM_TRIES} tries "
                f"(about 30 s) to claim {ROOT} and {home}: is it running "
                "and reachable (`twinstream status`; TWINSTREAM_ZK_CONNECT names it)?"
            ) from exc
        self._claimed = True

    def publish_standing(self, standing: Standing) -> None:
        """Say how this engine stands, for winners to compare (called about once a second
        from the engine's main loop). Never blocks on a suspended session: the write is
        asynchronous, and a failed one is simply made again at the next call."""
        path = posixpath.join(self._standing_path, self._identifier)
        session = self._client.client_id
        try:
            if self._standing_session != session or session is None:
                with contextlib.suppress(NodeExistsError):
                    self._client.create(path, standing.to_json(), ephemeral=True, makepath=True)
                self._client.set(path, standing.to_json())
                self._standing_session = session
            else:
                self._client.set_async(path, standing.to_json())
        except KazooException as exc:
            self._standing_session = None
            log.debug("election %s: standing not written (%r)", self._identifier, exc)

    def withdraw_standing(self) -> None:
        """The pipeline stopped: no winner should wait for this engine any more."""
        if self._standing is None:
            return
        with contextlib.suppress(KazooException):
            self._client.delete(posixpath.join(self._standing_path, self._identifier))
        self._standing_session = None

    def standings(self) -> dict[str, Standing]:
        """Every other engine's standing, as their nodes say now."""
        try:
            self._client.sync(self._standing_path)
            children = self._client.get_children(self._standing_path)
        except NoNodeError:
            return {}
        found: dict[str, Standing] = {}
        for child in children:
            if child == self._identifier:
                continue
            with contextlib.suppress(NoNodeError):
                data, _stat = self._client.get(posixpath.join(self._standing_path, child))
                standing = Standing.from_json(data)
                if standing is not None:
                    found[child] = standing
        return found

    def _hand_on_to(self) -> str | None:
        """Whom this win should go to instead (see the module's guarantee), or None."""
        if self._standing is None:
            return None
        now = self._clock()
        self._hand_ons = [t for t in self._hand_ons if now - t < HAND_ON_WINDOW_S]
        if len(self._hand_ons) >= MAX_HAND_ONS:
            return None
        try:
            others = self.standings()
            if not any(s.in_sync and s.eligible for s in others.values()):
                return None  # the usual takeover (a pair): no look at this engine's lag
            me = self._standing()
            other = preferred_over(me, others, self._prefer_margin)
        except Exception as exc:  # leading beats waiting on a question ZooKeeper cannot answer
            log.warning("election %s: standings unreadable (%r); leading", self._identifier, exc)
            return None
        if other is not None:
            self._hand_ons.append(now)
            log.warning(
                "election %s: won, but %s is more caught up (this engine: in sync %s, lag %s); "
                "handing the win on",
                self._identifier,
                other,
                me.in_sync,
                me.lag,
            )
        return other

    def contenders(self) -> list[str]:
        return list(self._client.Election(self._path).contenders())

    def resign(self) -> None:
        """Give up the leadership and rejoin as a contender; nothing unless leading."""
        if self._leading.is_set():
            self._resign.set()

    def resign_fenced(self, epoch: int, on_foreign: Callable[[], None]) -> threading.Thread:
        """The leader's producer was fenced at `epoch`: find out whether a contender or a
        client from outside the election did it (`on_foreign` then), and resign.

        Returns at once; the work runs on a thread of its own. Its caller holds the gate's
        lock, or is kazoo's connection thread itself (a commit retried on reconnection):
        the ZooKeeper reads here wait for the session, whose listener needs that lock or
        that thread, so doing them in the caller deadlocks while the session is
        SUSPENDED. The reads end when the session is back or LOST; then it resigns."""

        def check_then_resign() -> None:
            try:
                if self.fenced_from_outside(epoch):
                    on_foreign()
            finally:
                self.resign()

        thread = threading.Thread(
            target=check_then_resign, name=f"resign-{self._identifier}", daemon=True
        )
        thread.start()
        return thread

    def fenced_from_outside(self, epoch: int) -> bool:
        """Whether a fence of this leader's producer came from outside the election.

        Guarantee: a contender that wins raises the epoch counter before it fences (see
        `_lead`), so a leader fenced while it still holds the lock and the counter still
        reads its own `epoch` was fenced by a client that is no contender: a producer with
        the pipeline's transactional id and credentials that is no engine. False when
        ZooKeeper cannot tell (then the fence is treated as an ordinary step-down)."""
        if not self._leading.is_set():
            return False
        try:
            # A read may be served by a follower behind the leader: sync first, so that a
            # winner's increment is seen.
            self._client.sync(self._epoch_path)
            value = int(self._client.Counter(self._epoch_path).value)
        except KazooException as exc:
            log.warning("election %s: cannot read the epoch (%r)", self._identifier, exc)
            return False
        return value == epoch and self._holds_lock()

    def stop(self) -> None:
        """Leave the election for good (the pipeline stopped)."""
        self.withdraw_standing()
        self._stop.set()
        self._resign.set()
        if self._election is not None:
            self._election.cancel()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def may_lead(self) -> bool:
        """Whether this engine may lead now; said once in the log each time it may not."""
        if self._eligible is None or self._eligible():
            if self._ineligible_said:
                log.warning("election %s: may lead again; contending", self._identifier)
            self._ineligible_said = False
            return True
        if not self._ineligible_said:
            log.warning(
                "election %s: not eligible to lead (its output disagrees with the active's); "
                "out of the election until it is restored or overridden",
                self._identifier,
            )
            self._ineligible_said = True
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.may_lead():
                self._stop.wait(0.5)
                continue
            self._lost.clear()
            self._resign.clear()
            try:
                self._election = self._client.Election(self._path, self._identifier)
                self._election.run(self._lead)
            except KazooException as exc:
                log.warning("election %s: %r; entering again", self._identifier, exc)
            except Exception:
                log.exception("election %s failed; entering again", self._identifier)
            if not self._stop.is_set():
                self._sleep(0.2)
                self._revive()

    def _revive(self) -> None:
        """A client kazoo gave up on gets a new session. kazoo takes a connection dropped
        during the SASL handshake for a refusal (AUTH_FAILED) and stops reconnecting for
        good, and a process starved of CPU meets that on any reconnect under load: as on a
        lost session, the engine has stepped down; it starts a new session and queues again.
        A real refusal (a wrong password) is retried every few seconds, logged each time.

        `start`, never `restart`: kazoo's `stop` queues a close request for the connection
        thread, and on a client it gave up on that thread has already ended, so the request
        waits in the queue and the next session sends it the moment it connects. Each new
        session would then close itself within ~0.1 s and the next restart queue another:
        an engine under load would churn through sessions and never stand for election
        again, while ZooKeeper logs every one authenticated. (The same close-after-reset
        ordering is python-zk/kazoo#688, where it made stop() wait forever.)"""
        if self._stop.is_set() or self._client.client_state not in _STARTABLE:
            return
        log.warning(
            "election %s: the ZooKeeper client stopped (%s); starting a new session",
            self._identifier,
            self._client.client_state,
        )
        try:
            self._client.start()
        except Exception as exc:
            log.warning(
                "election %s: no new ZooKeeper session (%r); check the ZooKeeper password "
                "(TWINSTREAM_ZK_PASSWORD or zk-password in the state folder) if this repeats",
                self._identifier,
                exc,
            )
            self._sleep(2.0)

    def _lead(self) -> None:
        if self._stop.is_set():
            return
        # A session lost while queued set _lost; kazoo's lock then queued again in the new
        # session and has won in it. Forget that old loss, then check that the winning node
        # still exists: a loss from here on sets _lost again. Leading on a stale flag would
        # return at once and release the lock while the gate still believes it is active.
        self._lost.clear()
        if not self._holds_lock():
            log.warning(
                "election %s: won with a node that is gone; queueing again", self._identifier
            )
            return
        if not self.may_lead():
            return  # before the epoch: nothing fenced; it queues again once it may lead
        if self._hand_on_to() is not None:
            return  # before the epoch: nothing fenced, the next contender wins at once
        counter = self._client.Counter(self._epoch_path)
        counter += 1
        epoch = int(counter.value)
        log.warning("election %s: won, epoch %s", self._identifier, epoch)
        self._leading.set()
        try:
            try:
                self._on_elected(epoch)
            except Exception:
                log.exception("election %s: takeover failed; resigning", self._identifier)
                self._on_step_down("takeover failed")
                return
            while not (self._stop.is_set() or self._lost.is_set() or self._resign.is_set()):
                self._sleep(0.05)
            if not self._lost.is_set():
                self._on_step_down("resigned" if not self._stop.is_set() else "stopped")
        finally:
            self._leading.clear()

    def _holds_lock(self) -> bool:
        lock = getattr(self._election, "lock", None)
        if lock is None or lock.node is None:
            return False
        try:
            return self._client.exists(f"{lock.path}/{lock.node}") is not None
        except KazooException:
            return False
