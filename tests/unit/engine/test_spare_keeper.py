"""The keeper of a machine's warm spares (twinstream.engine.spare_keeper): its count, a spare
adopted or ended replaced, an adopted one never stopped, the rest stopped by pid. Its spares
here are small Python processes that speak the spare's handshake (no Spark)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from devkit.harness import wait_for
from twinstream.engine.spare import Adoption, SpareState, ask, warm_spares
from twinstream.engine.spare_keeper import Keeper

# A spare without a JVM: listens at once, and once adopted sleeps as an engine would run.
FAKE_SPARE = """
import sys, time
from pathlib import Path
from twinstream.engine.spare import Spare
spare = Spare(Path(sys.argv[1]))
spare.listen()
if spare.wait(lambda a: None) is not None:
    time.sleep(120)
"""


def fake(socket_path: Path) -> list[str]:
    return [sys.executable, "-c", FAKE_SPARE, str(socket_path)]


@pytest.fixture
def keeper(tmp_path: Path):
    keeper = Keeper(tmp_path / "spares", 2, dict(os.environ), command=fake)
    try:
        yield keeper
    finally:
        keeper.close()
        for spare in keeper.adopted:  # the engines they became: this test's to stop
            spare.proc.kill()
            spare.proc.wait(10)


def test_the_keeper_keeps_its_count_and_replaces_a_spare_that_became_an_engine(
    keeper: Keeper,
) -> None:
    keeper.fill()
    assert len(keeper.spares) == 2
    wait_for(lambda: len(warm_spares(keeper.folder)) == 2, 30, "two warm spares")
    first = keeper.spares[0]
    pid = ask(first.socket, Adoption("a", {"PATH": os.environ["PATH"]}))
    assert pid == first.proc.pid
    wait_for(lambda: first.status is SpareState.ADOPTED, 10, "the adopted note")
    keeper.fill()
    # Adopted: no longer a spare, and a new one in its place.
    assert first not in keeper.spares
    assert len(keeper.spares) == 2
    assert keeper.adopted == [first]
    (row,) = [r for r in keeper.status() if r["name"] == first.name]
    assert row["status"] == "adopted"
    assert row["engine_id"] == "a"
    # Closing stops the spares, by pid, never the engine a spare became.
    spares = list(keeper.spares)
    keeper.close()
    assert all(s.proc.poll() is not None for s in spares)
    assert first.proc.poll() is None


def test_a_spare_that_ends_is_replaced(keeper: Keeper) -> None:
    keeper.fill()
    victim = keeper.spares[0]
    victim.proc.kill()
    victim.proc.wait(10)
    assert victim.status is SpareState.RETIRED
    keeper.fill()
    assert victim not in keeper.spares
    assert len(keeper.spares) == 2
    assert victim not in keeper.adopted


def test_take_gives_a_warm_spare_as_the_engine_and_starts_another(keeper: Keeper) -> None:
    assert keeper.take("a", dict(os.environ)) is None  # none warm yet: start it cold
    wait_for(lambda: len(warm_spares(keeper.folder)) == 2, 30, "two warm spares")
    taken = keeper.take("b", dict(os.environ))
    assert taken is not None
    assert psutil.Process(taken.proc.pid).is_running()
    wait_for(lambda: taken.status is SpareState.ADOPTED, 10, "the adopted note")
    keeper.fill()
    assert taken in keeper.adopted
    assert len(keeper.spares) == 2


def test_each_spare_runs_in_a_session_of_its_own(keeper: Keeper) -> None:
    """A supervisor's stop of the keeper's process group must reach no spare, nor the engine
    one became: the keeper stops its spares itself."""
    keeper.fill()
    for spare in keeper.spares:
        assert os.getsid(spare.proc.pid) == spare.proc.pid


def test_the_keepers_status_is_read_while_it_runs_and_gone_after(keeper: Keeper) -> None:
    import threading

    from twinstream.engine.spare_keeper import read_status

    assert read_status(keeper.folder) is None  # no keeper ran there
    stop = threading.Event()
    loop = threading.Thread(target=keeper.run, args=(stop, 0.1), name="keeper")
    loop.start()
    try:
        rows = wait_for(lambda: read_status(keeper.folder), 30, "the keeper's status")
        assert len(rows) == 2
        assert {r["status"] for r in rows} <= {"warming", "warm"}
    finally:
        stop.set()
        loop.join(30)
    assert read_status(keeper.folder) is None


def test_status_says_how_many_spares_are_warm_and_which_engines_they_became() -> None:
    from twinstream.ops.overview import spare_views
    from twinstream.ops.status_view import spares_text

    views = spare_views(
        [
            {"name": "1-1", "pid": 11, "status": "warm"},
            {"name": "1-2", "pid": 12, "status": "warming"},
            {"name": "1-3", "pid": 13, "status": "adopted", "engine_id": "a", "at": 0.0},
        ]
    )
    assert views is not None
    text = spares_text(views).plain
    assert text == (
        "warm spares: 1 warm, 1 warming; adopted as engine a since "
        "1970-01-01T00:00:00+00:00 (pid 13)"
    )
    cold = spares_text(spare_views([{"name": "1-1", "pid": 11, "status": "warming"}]) or [])
    assert "restarts cold until one is warm" in cold.plain
    assert spare_views(None) is None
