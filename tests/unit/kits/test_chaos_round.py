"""A failover round's end: the pair whole again with the victim in it, whichever role the
victim came back in. Fakes for the engines, the kill and the takeover measurement."""

import contextlib
import os
import signal
from functools import partial
from types import SimpleNamespace
from typing import cast

import pytest

from devkit import chaos
from tests.unit.fakes import pipeline_info, server_info
from twinstream.ops.audit import Findings


class Client:
    def server(self):
        return server_info(epoch=5, pid=123, role="active")

    def pipeline(self):
        return pipeline_info(last_msg_id_published=10)


class Engines:
    """Active a and in-sync standby b; after the kill, the pairs of `after` in turn."""

    settings = None

    def __init__(self, after):
        self.after = list(after)
        self.clients = {"a": Client(), "b": Client()}

    def wait_pair(self, timeout_s=180.0):
        return ("a", "b")

    def pid(self, engine_id):
        return 123

    def wait_restarted(self, engine_id, old_pid, timeout_s=120.0):
        return 124

    def current_pair(self):
        return self.after.pop(0) if len(self.after) > 1 else self.after[0]


def engines(*after):
    return cast(chaos.SupervisedEngines, Engines(after))


@pytest.fixture(autouse=True)
def no_real_failure(monkeypatch):
    killed = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(chaos, "process_tree", lambda pid: {pid})
    monkeypatch.setattr(chaos, "wait_gone", lambda pids: None)
    monkeypatch.setattr(chaos, "KafkaEpochTail", lambda settings: contextlib.nullcontext())

    def takeover(result, standbys, tail, started, timeout_s):
        result.new_active, result.role_s, result.first_output_s = "b", 1.1, 1.5

    monkeypatch.setattr(chaos, "measure_takeover", takeover)
    return killed


def test_the_victim_back_as_the_standby(no_real_failure):
    r = chaos.failover_round(engines(None, ("b", "a")), "kill")
    assert r.takeover.stopped == "a"
    assert not r.swapped
    assert no_real_failure == [(123, signal.SIGKILL)]


def test_the_victim_back_as_the_active_after_its_successor_lost_its_session():
    # Waiting for the victim to be the standby would time out: it is the active now.
    r = chaos.failover_round(engines(None, ("a", "b")), "kill")
    assert r.swapped


def test_a_pair_without_the_victim_is_not_the_end_of_the_round(monkeypatch):
    monkeypatch.setattr(chaos, "wait_for", fake_wait_for)
    with pytest.raises(AssertionError, match="engine a back"):
        chaos.failover_round(engines(("b", "c")), "kill")


def fake_wait_for(condition, timeout_s, what, every_s=0.2):
    """One look, then time out: the real wait would poll for `timeout_s`."""
    value = condition()
    if value:
        return value
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_the_rejoin_wait_is_the_callers_to_choose(monkeypatch):
    waits = []

    def record(condition, timeout_s, what, every_s=0.2):
        waits.append((what, timeout_s))
        return condition()

    monkeypatch.setattr(chaos, "wait_for", record)
    chaos.failover_round(engines(("b", "a")), "kill", rejoin_timeout_s=900.0)
    assert ("engine a back, with an active and an in-sync standby", 900.0) in waits


def test_a_load_is_audited_in_every_partition_once_each_is_published(monkeypatch):
    """audit_load: the inbound grew by what the load sent, every partition's end is
    published, then each partition's window is audited from where the load began."""
    positions = iter([{0: 5, 1: 3, 2: 7}, {0: 10, 1: 9, 2: 9}])

    class ThreeClient(Client):
        def pipeline(self):
            return pipeline_info(last_msg_id_published=None, published=next(positions))

    engines = SimpleNamespace(clients={"a": ThreeClient()}, settings=None)
    fake = cast(chaos.SupervisedEngines, engines)
    fake.wait_published = partial(chaos.SupervisedEngines.wait_published, fake)  # type: ignore[method-assign]
    monkeypatch.setattr(chaos, "inbound_ends", lambda settings: {0: 11, 1: 10, 2: 10})
    audited_from: dict[str, dict[int, int]] = {}

    def audit_ranges(settings, firsts, ends):
        audited_from.update(firsts=dict(firsts), ends=dict(ends))
        return {
            p: Findings(first=firsts.get(p, 0), end=e, rows=e - firsts.get(p, 0))
            for p, e in ends.items()
        }

    monkeypatch.setattr(chaos, "audit_ranges", audit_ranges)
    monkeypatch.setattr(chaos, "wait_for", lambda check, *_a, **_k: check() or check())
    audited = chaos.audit_load(fake, {0: 1, 1: 0, 2: 5}, sent=25)
    assert audited_from == {"firsts": {0: 1, 1: 0, 2: 5}, "ends": {0: 11, 1: 10, 2: 10}}
    assert sorted(audited) == [0, 1, 2]
    with pytest.raises(AssertionError, match="inbound grew by 25, the load sent 24"):
        chaos.audit_load(fake, {0: 1, 1: 0, 2: 5}, sent=24)


def test_findings_of_several_partitions_are_named_by_record_id():
    audited = {
        0: Findings(first=0, end=10, rows=10, missing=[(3, 4)]),
        2: Findings(first=0, end=10, rows=10, missing=[(7, 7)]),
    }
    assert chaos.flagged(audited, "missing") == [(3, 4), ((2 << 48) | 7, (2 << 48) | 7)]
    assert chaos.flagged(audited, "duplicated") == []
