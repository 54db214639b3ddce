"""bench/failover.py's warm-up: the first round must not strike before the engines have
kept up with the load for a while."""

import importlib.util
import sys
from types import SimpleNamespace

import pytest

from tests.unit.fakes import FakeClock
from twinstream.platform.settings import REPO_ROOT


@pytest.fixture
def failover():
    spec = importlib.util.spec_from_file_location("bench_failover", REPO_ROOT / "bench/failover.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_failover"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_failover"]


class Engines:
    """In sync from the start, as idle engines are before the load reaches them."""

    def __init__(self, clock):
        self.clock = clock
        self.pair_asked_at: list[float] = []
        client = SimpleNamespace(pipeline=lambda: {"lag": 0})
        self.clients = {"a": client, "b": client}

    def wait_pair(self, timeout_s):
        self.pair_asked_at.append(self.clock.now)
        return ("a", "b")


def test_the_warm_up_waits_for_the_settle_time_even_when_the_pair_looks_ready(
    failover, monkeypatch, capsys
):
    clock = FakeClock()
    monkeypatch.setattr(failover, "time", clock)
    engines = Engines(clock)
    failover.warm_up(engines, load_started=0.0, settle_s=60.0)
    assert engines.pair_asked_at == [60.0]
    assert "warming up (0 s of load)" in capsys.readouterr().out


def test_no_settle_time_once_the_load_has_run_long_enough(failover, monkeypatch):
    clock = FakeClock()
    clock.now = 500.0
    monkeypatch.setattr(failover, "time", clock)
    engines = Engines(clock)
    failover.warm_up(engines, load_started=0.0, settle_s=60.0)
    assert engines.pair_asked_at == [500.0]
