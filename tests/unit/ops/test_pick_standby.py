"""persist_standby_state with three engines (issue 38, 1 + N): `ops.operate.pick_standby`
chooses exactly one engine to persist from, an in-sync standby that ZooKeeper does not name
as the leader, never the active; the other standby is left alone, hot. Every combination of
three engines' states and of ZooKeeper's leader is tried."""

from __future__ import annotations

import itertools

import pytest

from twinstream.ops import operate
from twinstream.ops.operate import OperateError
from twinstream.ops.overview import EngineView

PIPELINE = "payments"
ENGINES = ("c", "d", "e")


def view(engine_id: str, kind: str) -> EngineView:
    """An engine as the DAG observes it: active, standby (in sync), behind (a standby not
    in sync), stopped, or down (it does not answer)."""
    if kind == "down":
        return EngineView(pipeline=PIPELINE, engine_id=engine_id, problem="refused")
    return EngineView(
        pipeline=PIPELINE,
        engine_id=engine_id,
        role="active" if kind == "active" else "standby",
        zk_state="CONNECTED",
        state="stopped" if kind == "stopped" else "running",
        in_sync=kind != "behind",
        lag=0,
    )


KINDS = ("active", "standby", "behind", "stopped", "down")


def test_one_active_and_two_in_sync_standbys_persist_from_one_standby_only():
    views = [view("c", "standby"), view("d", "active"), view("e", "standby")]
    chosen = operate.pick_standby(views, leader="d")
    assert chosen == "c"
    # The same answer every run: the snapshots come from one engine while it stays fit.
    assert {operate.pick_standby(views, leader="d") for _ in range(5)} == {"c"}


def test_a_standby_zookeeper_names_as_leader_is_never_chosen():
    """A takeover the views have not seen yet: e still says standby, ZooKeeper already
    names it; the other standby is chosen, not the new active."""
    views = [view("c", "active"), view("d", "behind"), view("e", "standby")]
    with pytest.raises(OperateError, match="ZooKeeper leader: e"):
        operate.pick_standby(views, leader="e")
    views = [view("c", "active"), view("d", "standby"), view("e", "standby")]
    assert operate.pick_standby(views, leader="e") == "d"


@pytest.mark.parametrize("leader", [*ENGINES, None])
def test_among_three_engines_the_choice_is_one_in_sync_standby_never_the_leader(leader):
    for kinds in itertools.product(KINDS, repeat=len(ENGINES)):
        views = [view(e, k) for e, k in zip(ENGINES, kinds, strict=True)]
        fit = [e for e, k in zip(ENGINES, kinds, strict=True) if k == "standby" and e != leader]
        if not fit:
            with pytest.raises(OperateError, match="no in-sync standby"):
                operate.pick_standby(views, leader)
            continue
        chosen = operate.pick_standby(views, leader)
        # One engine id, the first fit one: every other engine, the second standby
        # included, is not asked to persist.
        assert isinstance(chosen, str)
        assert chosen == fit[0], (kinds, leader)
        assert chosen != leader
        assert dict(zip(ENGINES, kinds, strict=True))[chosen] == "standby"
