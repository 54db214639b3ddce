"""The election loop with a fake kazoo client: callbacks on win, SUSPENDED, LOST, resign."""

import threading
import time

import pytest
from kazoo.client import KazooState
from kazoo.exceptions import AuthFailedError, ConnectionLoss, NoAuthError, NoNodeError
from kazoo.protocol.states import KeeperState
from kazoo.security import make_acl, make_digest_acl

from twinstream.core.election import (
    MAX_HAND_ONS,
    Election,
    ForeignNodeError,
    Standing,
    check_owned,
    preferred_over,
)


class FakeCounter:
    value = 0

    def __iadd__(self, n):
        FakeCounter.value += n
        return self


class FakeLock:
    def __init__(self, path, node):
        self.path = path
        self.node = node


class FakeZkElection:
    def __init__(self, client, path):
        self.client = client
        self.cancelled = False
        self.lock = FakeLock(path, f"node-{client.runs:010d}")

    def run(self, func):
        self.client.runs += 1
        # Whatever happened to the session while queued, kazoo's lock has now won.
        self.client.before_win(self)
        func()

    def cancel(self):
        self.cancelled = True


class FakeClient:
    state = KazooState.CONNECTED
    client_state = KeeperState.CONNECTED

    def __init__(self):
        self.listeners = []
        self.runs = 0
        self.gone: set[str] = set()
        self.before_win = lambda election: None

    def add_listener(self, listener):
        self.listeners.append(listener)

    def start(self, timeout=15):
        self.starts = getattr(self, "starts", 0) + 1
        self.client_state = KeeperState.CONNECTED

    def restart(self):
        # kazoo's restart on a client whose connection thread has ended leaves its close
        # request queued for the next session, which then closes itself (Election._revive).
        raise AssertionError("restart() on a client kazoo gave up on ends the next session")

    def exists(self, path):
        return None if path in self.gone else object()

    def Election(self, path, identifier=None):
        return FakeZkElection(self, path)

    def Counter(self, path):
        return FakeCounter()

    def sync(self, path):
        self.synced = path

    def emit(self, state):
        for listener in self.listeners:
            listener(state)


def test_win_suspend_lose_and_win_again():
    FakeCounter.value = 0
    client = FakeClient()
    events = []
    second_win = threading.Event()

    def on_elected(epoch):
        events.append(("elected", epoch))
        if epoch == 2:
            second_win.set()

    election = Election(
        client,
        "/twinstream/p/election",
        "/twinstream/p/epoch",
        "a",
        on_elected=on_elected,
        on_step_down=lambda reason: events.append(("down", reason)),
        on_connection=lambda ok: events.append(("connected", ok)),
    )
    lost_once = threading.Event()

    def driver(_seconds):
        # Runs in place of sleep inside the leadership loop: drive the session's states.
        if events[-1] == ("elected", 1) and not lost_once.is_set():
            client.emit(KazooState.SUSPENDED)
            client.emit(KazooState.CONNECTED)
            lost_once.set()
            client.emit(KazooState.LOST)
        elif second_win.is_set():
            election.stop()

    election._sleep = driver
    election.start()
    assert second_win.wait(5)
    election.stop()
    assert events[:5] == [
        ("elected", 1),
        ("connected", False),
        ("connected", True),
        ("down", "ZooKeeper session lost"),
        ("elected", 2),
    ]
    assert client.runs >= 2
    assert election.zk_state == str(KazooState.LOST)


def _election(client, events, sleep, identifier="a", **options):
    """An election on `client` that records its callbacks in `events`."""
    return Election(
        client,
        "/twinstream/p/election",
        "/twinstream/p/epoch",
        identifier,
        on_elected=lambda epoch: events.append(("elected", epoch)),
        on_step_down=lambda reason: events.append(("down", reason)),
        on_connection=lambda ok: events.append(("connected", ok)),
        sleep=sleep,
        **options,
    )


def _lead_until(client, before_win, done) -> list[tuple[str, object]]:
    """Run an election on `client` until `done(events)`; the events it saw."""
    FakeCounter.value = 0
    client.before_win = before_win
    events: list[tuple[str, object]] = []

    def sleep(_seconds):
        if done(events):
            election._stop.set()  # stop() would join this very thread

    election = _election(client, events, sleep, identifier="b")
    election.start()
    thread = election._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()
    return events


def test_a_session_lost_while_queued_does_not_end_the_later_leadership():
    """A standby's session expires while it waits in the queue; kazoo queues it again in
    the new session and it wins there. It must lead until told otherwise, not return at
    once on the old loss (which released the lock while the gate still said active)."""
    client = FakeClient()
    ticks = []

    def lost_while_queued(_election):
        if client.runs == 1:
            client.emit(KazooState.SUSPENDED)
            client.emit(KazooState.LOST)
            client.emit(KazooState.CONNECTED)

    def twenty_ticks(_events):
        ticks.append(1)
        return len(ticks) >= 20

    events = _lead_until(client, lost_while_queued, twenty_ticks)
    assert [e for e in events if e[0] == "elected"] == [("elected", 1)]
    assert client.runs == 1
    assert events[-1] == ("down", "stopped")


def test_a_win_whose_node_is_gone_is_not_taken():
    client = FakeClient()

    def node_gone_on_first_win(election):
        if client.runs == 1:
            client.gone.add(f"{election.lock.path}/{election.lock.node}")

    events = _lead_until(client, node_gone_on_first_win, lambda events: ("elected", 1) in events)
    # The first win was refused (no epoch spent on it); the second, with a live node, led.
    assert [e for e in events if e[0] == "elected"] == [("elected", 1)]
    assert client.runs == 2


def test_a_leader_that_resigns_steps_down_and_queues_again():
    # The gate's producer failed for good: the engine resigns, and wins again with a new one.
    FakeCounter.value = 0
    client = FakeClient()
    events: list[tuple[str, object]] = []

    def sleep(_seconds):
        if events == [("elected", 1)]:
            election.resign()
        elif ("elected", 2) in events:
            election._stop.set()

    election = _election(client, events, sleep)
    election.start()
    assert election._thread is not None
    election._thread.join(5)
    assert events[:3] == [("elected", 1), ("down", "resigned"), ("elected", 2)]


def test_a_resign_while_not_leading_is_ignored_not_kept_for_the_next_win():
    # A fenced zombie resigns after its session is lost, while it queues again: kept, that
    # resign would have thrown away its next leadership the moment it won.
    FakeCounter.value = 0
    client = FakeClient()
    events: list[tuple[str, object]] = []
    ticks = []

    def sleep(_seconds):
        ticks.append(1)
        if len(ticks) >= 20:
            election._stop.set()

    election = _election(client, events, sleep)
    client.before_win = lambda _e: election.resign()  # queued, about to win
    election.start()
    assert election._thread is not None
    election._thread.join(5)
    assert [e for e in events if e[0] == "elected"] == [("elected", 1)]
    assert events[-1] == ("down", "stopped")


def test_a_fence_is_from_outside_only_while_leading_the_lock_and_the_epoch_unchanged():
    # A legitimate winner raises the counter before it fences: the counter still at the
    # leader's epoch, with the leader's node still first, means no contender fenced it.
    FakeCounter.value = 0
    client = FakeClient()
    events: list[tuple[str, object]] = []
    seen: list[tuple[bool, bool, bool]] = []

    def sleep(_seconds):
        if events == [("elected", 1)] and not seen:
            outside = election.fenced_from_outside(1)
            FakeCounter.value = 2  # a contender won and raised the epoch
            by_winner = election.fenced_from_outside(1)
            FakeCounter.value = 1
            assert election._election is not None
            client.gone.add(f"{election._election.lock.path}/{election._election.lock.node}")
            node_gone = election.fenced_from_outside(1)
            seen.append((outside, by_winner, node_gone))
            election._stop.set()

    election = _election(client, events, sleep)
    assert election.fenced_from_outside(0) is False  # not leading
    election.start()
    assert election._thread is not None
    election._thread.join(5)
    assert seen == [(True, False, False)]
    assert client.synced == "/twinstream/p/epoch"


class AclClient:
    def __init__(self, acls):
        self.acls = acls

    def get_acls(self, path):
        acl = self.acls[path]
        if isinstance(acl, Exception):
            raise acl
        return acl, None


def test_a_node_someone_else_made_is_refused_with_the_fix():
    ours = [make_acl("sasl", "twinstream", all=True)]
    client = AclClient(
        {
            "/ours": ours,
            "/missing": NoNodeError(),
            "/theirs": [make_digest_acl("mallory", "pw", all=True)],
            "/shared": [*ours, make_acl("world", "anyone", create=True)],
            "/hidden": NoAuthError(),
        }
    )
    check_owned(client, "/ours", ours)
    check_owned(client, "/missing", ours)  # made with our ACL when needed
    with pytest.raises(ForeignNodeError, match=r"digest:mallory:.*:rwcda.*deleteall /theirs"):
        check_owned(client, "/theirs", ours)
    with pytest.raises(ForeignNodeError, match="world:anyone:c"):
        check_owned(client, "/shared", ours)
    with pytest.raises(ForeignNodeError, match="not readable by us"):
        check_owned(client, "/hidden", ours)


def test_a_client_kazoo_gave_up_on_after_a_sasl_drop_gets_a_new_session():
    # kazoo takes a connection dropped during the SASL handshake (a starved process under
    # load) for AUTH_FAILED and never reconnects: without a restart, the engine would
    # retry the election on a dead client forever.
    FakeCounter.value = 0
    client = FakeClient()
    events: list[tuple[str, object]] = []

    def before_win(_election):
        if client.runs == 1:
            client.client_state = KeeperState.AUTH_FAILED
            raise AuthFailedError()
        election._stop.set()

    client.before_win = before_win
    election = _election(client, events, lambda _s: None)
    election.start()
    assert election._thread is not None
    election._thread.join(5)
    assert client.starts == 1
    assert client.runs == 2
    assert client.client_state == KeeperState.CONNECTED


def test_resigning_after_a_fence_never_waits_for_zookeeper_in_the_callers_thread():
    # The caller holds the gate's lock (or is kazoo's connection thread): a ZooKeeper read
    # there, while the session is SUSPENDED, deadlocked an engine (the reconnection's
    # listener waits for that lock). The check waits elsewhere; the resign follows it.
    FakeCounter.value = 0
    client = FakeClient()
    zookeeper_back = threading.Event()
    synced = client.sync

    def sync_when_back(path):
        zookeeper_back.wait(10)
        synced(path)

    client.sync = sync_when_back  # type: ignore[method-assign]
    events: list[tuple[str, object]] = []
    foreign: list[bool] = []
    resigned = threading.Event()

    def sleep(_seconds):
        if events == [("elected", 1)] and not resigned.is_set():
            started = time.monotonic()
            thread = election.resign_fenced(1, lambda: foreign.append(True))
            assert time.monotonic() - started < 0.5  # did not wait for ZooKeeper
            assert not election._resign.is_set()
            zookeeper_back.set()
            thread.join(5)
            resigned.set()

    election = _election(client, events, sleep)
    election.start()
    assert resigned.wait(10)
    assert election._resign.is_set() or ("down", "resigned") in events
    election._stop.set()
    assert election._thread is not None
    election._thread.join(5)
    assert foreign == [True]  # the counter still at the leader's epoch, its node first


# -- preference: the most caught-up in-sync engine leads (issue 35) ------------------------

IN_SYNC = Standing(True, 100)
FAR_BEHIND = Standing(False, 250_000)


@pytest.mark.parametrize(
    ("me", "others", "expected"),
    [
        # Restoring or cold while another is in sync: hand on.
        (FAR_BEHIND, {"b": IN_SYNC}, "b"),
        (Standing(False, None), {"b": IN_SYNC}, "b"),
        # The most caught-up of several in-sync engines.
        (FAR_BEHIND, {"b": Standing(True, 900), "c": Standing(True, 40)}, "c"),
        # In sync myself: only one more than a batch (the margin) less behind wins it.
        (Standing(True, 4_000), {"b": Standing(True, 0)}, None),
        (Standing(True, 6_000), {"b": Standing(True, 500)}, "b"),
        # Nobody in sync (a double failure): whoever won leads, the fastest way back.
        (FAR_BEHIND, {"b": Standing(False, 10)}, None),
        (FAR_BEHIND, {}, None),
        # In sync with an unknown lag: nothing to compare.
        (Standing(True, None), {"b": Standing(True, 0)}, None),
        # One that may not lead (its output disagrees with the active's) is never preferred.
        (FAR_BEHIND, {"b": Standing(True, 0, eligible=False)}, None),
        (FAR_BEHIND, {"b": Standing(True, 0, eligible=False), "c": Standing(True, 90)}, "c"),
    ],
)
def test_preferred_over(me, others, expected):
    assert preferred_over(me, others, margin=5_000) == expected


def test_standing_round_trips_and_a_damaged_node_is_ignored():
    assert Standing.from_json(FAR_BEHIND.to_json()) == FAR_BEHIND
    ineligible = Standing(True, 3, eligible=False)
    assert Standing.from_json(ineligible.to_json()) == ineligible
    # An engine of the version before says nothing of it: eligible.
    assert Standing.from_json(b'{"in_sync": true, "lag": 3}') == Standing(True, 3)
    assert Standing.from_json(b"not json") is None
    assert Standing.from_json(b'{"lag": 3}') is None


def test_a_winner_far_behind_hands_on_without_an_epoch_then_leads_when_nobody_takes_it():
    """Behind while `b` says it is in sync: each win is handed on before the epoch counter
    moves; once MAX_HAND_ONS wins went nowhere (b never took them) this engine leads."""
    FakeCounter.value = 0
    client = FakeClient()
    events: list[tuple[str, object]] = []
    wins = threading.Event()

    def sleep(_seconds):
        # Called between wins and while leading: stop once this engine leads.
        if ("elected", 1) in events:
            wins.set()
            election.stop()

    election = _election(
        client, events, sleep, standing=lambda: FAR_BEHIND, prefer_margin=5_000, clock=lambda: 0.0
    )
    election.standings = lambda: {"b": IN_SYNC}
    election.withdraw_standing = lambda: None
    election.start()
    assert wins.wait(5)
    election.stop()
    assert events[0] == ("elected", 1)  # one epoch: the handed-on wins took none
    assert client.runs == MAX_HAND_ONS + 1


def test_an_engine_that_may_not_lead_stays_out_then_leads_once_it_may():
    """Ineligible (it disagrees with the active): it takes no epoch, win or not; once it
    may lead (restored, overridden) it enters the election and leads."""
    FakeCounter.value = 0
    client = FakeClient()
    events: list[tuple[str, object]] = []
    may_lead = threading.Event()
    led = threading.Event()

    def sleep(_seconds: float) -> None:
        if ("elected", 1) in events:
            led.set()
            election.stop()

    election = _election(client, events, sleep, eligible=may_lead.is_set)
    election.start()
    time.sleep(0.3)  # the election's thread waits out its ineligibility (polls every 0.5 s)
    assert events == []
    assert client.runs == 0
    assert FakeCounter.value == 0
    # A win it had queued for is given up before the epoch.
    election._election = client.Election("/twinstream/p/election")
    election._lead()
    assert FakeCounter.value == 0
    assert events == []
    may_lead.set()
    assert led.wait(5)
    election.stop()
    assert events[0] == ("elected", 1)


def test_a_winner_in_sync_leads_at_once():
    FakeCounter.value = 0
    client = FakeClient()
    events: list[tuple[str, object]] = []

    led = threading.Event()

    def sleep(_seconds: float) -> None:
        led.set()  # called once leading
        election.stop()

    election = _election(client, events, sleep, standing=lambda: IN_SYNC, prefer_margin=5_000)
    election.standings = lambda: {"b": FAR_BEHIND}
    election.withdraw_standing = lambda: None
    election.start()
    # stop() before the election's thread ran would leave it no chance to win at all.
    assert led.wait(5)
    election.stop()
    assert events == [("elected", 1)]
    assert client.runs == 1


@pytest.mark.parametrize(
    ("client_state", "starts"),
    [
        (KeeperState.CONNECTING, 0),  # SUSPENDED: kazoo is reconnecting
        (KeeperState.CONNECTED, 0),
        (KeeperState.CLOSED, 1),  # never started, or stopped
        (KeeperState.AUTH_FAILED, 1),  # kazoo gave up on it
    ],
)
def test_entering_the_election_starts_only_a_client_that_is_not_running(client_state, starts):
    # An engine's POST /pipeline/start hung for good when its pipeline entered the election
    # while its session was SUSPENDED: kazoo's start() on a reconnecting client closes it
    # first, joining the handler thread whose state listener waited for that engine.
    FakeCounter.value = 0
    client = FakeClient()
    client.client_state = client_state
    client.state = {
        KeeperState.CONNECTING: KazooState.SUSPENDED,
        KeeperState.CONNECTED: KazooState.CONNECTED,
    }.get(client_state, KazooState.LOST)
    client.before_win = lambda _election: election._stop.set()
    election = _election(client, [], lambda _s: None)
    election.start()
    assert election._thread is not None
    election._thread.join(5)
    assert getattr(client, "starts", 0) == starts


class _Unanswered:
    """A kazoo client whose ZooKeeper never answers."""

    def __init__(self) -> None:
        self.stopped = self.closed = False

    def start(self, timeout: float) -> None:
        from kazoo.handlers.threading import KazooTimeoutError

        raise KazooTimeoutError("Connection time-out")

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.closed = True


def test_a_short_session_to_a_zookeeper_that_never_answers_names_the_hosts_and_the_fix():
    from twinstream.core.election import ZooKeeperUnreachable, zk_session
    from twinstream.platform.connections import ZooKeeperConnection

    client = _Unanswered()
    zk = ZooKeeperConnection("127.0.0.1:1", 1.0, "twinstream", "secret")
    with (
        pytest.raises(ZooKeeperUnreachable, match=r"127\.0\.0\.1:1 did not answer.*make up"),
        zk_session(zk, timeout_s=0.1, client_of=lambda _zk: client),
    ):
        pass
    # No reconnecting thread left behind.
    assert client.stopped
    assert client.closed


def test_a_short_session_is_stopped_and_closed_after_its_work():
    from twinstream.core.election import zk_session
    from twinstream.platform.connections import ZooKeeperConnection

    class Answered(_Unanswered):
        def start(self, timeout: float) -> None:
            pass

    client = Answered()
    zk = ZooKeeperConnection("127.0.0.1:1", 1.0, "twinstream", "secret")

    def work() -> None:
        with zk_session(zk, client_of=lambda _zk: client) as got:
            assert got is client
            raise KeyError("the command's own error")

    with pytest.raises(KeyError):
        work()
    assert client.stopped
    assert client.closed


class DroppingClient(FakeClient):
    """A client whose connection drops `drops` times while the nodes are claimed: each
    drop raises ConnectionLoss, as kazoo does while it reconnects within the session."""

    def __init__(self, ours, drops):
        super().__init__()
        self.ours = ours
        self.drops = drops
        self.made: list[str] = []

    def _maybe_drop(self):
        if self.drops > 0:
            self.drops -= 1
            raise ConnectionLoss()

    def exists(self, path):
        self._maybe_drop()
        return object() if path in self.made else None

    def create(self, path, acl=None):
        self._maybe_drop()
        self.made.append(path)

    def ensure_path(self, path, acl=None):
        self._maybe_drop()
        self.made.append(path)

    def get_acls(self, path):
        self._maybe_drop()
        return self.ours, None


def claiming(client, sleeps):
    return Election(
        client,
        "/twinstream/p/election",
        "/twinstream/p/epoch",
        "a",
        on_elected=lambda epoch: None,
        on_step_down=lambda reason: None,
        on_connection=lambda ok: None,
        sleep=sleeps.append,
        root_acl=client.ours,
    )


def test_a_claim_goes_on_through_dropped_connections_and_then_holds():
    ours = [make_acl("sasl", "twinstream", all=True)]
    client, sleeps = DroppingClient(ours, drops=3), list[float]()
    election = claiming(client, sleeps)
    election.claim()
    assert client.made == ["/twinstream", "/twinstream/p"]
    assert len(sleeps) == 3  # one wait per drop, by the election's own sleep
    client.drops = 1
    election.claim()  # claimed once: never asked again, so no drop meets it
    assert client.drops == 1


def test_a_claim_zookeeper_never_answers_says_so_and_names_the_check():
    ours = [make_acl("sasl", "twinstream", all=True)]
    client, sleeps = DroppingClient(ours, drops=10**9), list[float]()
    with pytest.raises(ConnectionLoss, match=r"did not answer 20 tries.*twinstream status"):
        claiming(client, sleeps).claim()
    assert 25 < sum(sleeps) < 45, sum(sleeps)
