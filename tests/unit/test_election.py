"""The election loop with a fake kazoo client: callbacks on win, SUSPENDED, LOST, resign."""

import threading

from kazoo.client import KazooState

from twinstream.election import Election


class FakeCounter:
    value = 0

    def __iadd__(self, n):
        FakeCounter.value += n
        return self


class FakeZkElection:
    def __init__(self, client):
        self.client = client
        self.cancelled = False

    def run(self, func):
        self.client.runs += 1
        func()

    def cancel(self):
        self.cancelled = True


class FakeClient:
    state = KazooState.CONNECTED

    def __init__(self):
        self.listeners = []
        self.runs = 0

    def add_listener(self, listener):
        self.listeners.append(listener)

    def exists(self, path):
        return True

    def Election(self, path, identifier=None):
        return FakeZkElection(self)

    def Counter(self, path):
        return FakeCounter()

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
