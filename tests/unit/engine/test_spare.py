"""The warm spare's handshake (twinstream.engine.spare): which identity it takes, never two
engines from one spare nor one spare for two askers, and what a lost message costs. Real
Unix sockets, the asker in a thread; no Spark."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from twinstream.engine.spare import (
    TRANSITIONS,
    Adoption,
    Spare,
    SpareState,
    adopt,
    ask,
    warm_spares,
)

ENV = {"TWINSTREAM_PIPELINE": "clicks", "PATH": "/usr/bin"}


class Running:
    """A spare serving in a thread until it is adopted or told to stop."""

    def __init__(
        self, path: Path, accept: Callable[[Adoption], str | None] = lambda _a: None, **kw: float
    ) -> None:
        self.spare = Spare(path, **kw)
        self.spare.listen()
        self.stopping = threading.Event()
        self.adopted: list[Adoption | None] = []
        self.thread = threading.Thread(
            target=lambda: self.adopted.append(self.spare.wait(accept, self.stopping.is_set)),
            name=f"spare-{path.name}",
        )
        self.thread.start()

    def end(self) -> Adoption | None:
        self.stopping.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.adopted[0]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    # pytest's tmp_path is short enough for a Unix socket's name (at most 107 bytes).
    return tmp_path


def test_a_spare_becomes_the_engine_its_asker_names_with_the_askers_environment(
    folder: Path,
) -> None:
    running = Running(folder / "s1.sock")
    pid = ask(folder / "s1.sock", Adoption("b", ENV))
    running.thread.join(10)
    assert running.adopted == [Adoption("b", ENV)]
    assert pid is not None
    assert pid > 0
    assert running.spare.state is SpareState.ADOPTED
    # Adopted: its socket is gone, so no second asker can reach it.
    assert not (folder / "s1.sock").exists()
    assert ask(folder / "s1.sock", Adoption("a", ENV)) is None


def test_a_spare_that_cannot_take_an_engine_says_why_and_stays_a_spare(folder: Path) -> None:
    running = Running(
        folder / "s1.sock",
        accept=lambda a: (
            "static Spark settings differ: spark.driver.memory" if a.engine_id == "big" else None
        ),
    )
    assert ask(folder / "s1.sock", Adoption("big", ENV)) is None
    assert running.spare.state is SpareState.WARM
    assert ask(folder / "s1.sock", Adoption("a", ENV)) is not None
    running.thread.join(10)
    assert running.adopted == [Adoption("a", ENV)]


def test_an_asker_that_never_confirms_leaves_the_spare_a_spare(folder: Path) -> None:
    """The asker died (or timed out) after the answer: the spare does not become an engine
    nobody supervises, and the next asker gets it."""
    running = Running(folder / "s1.sock", confirm_s=0.5)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(folder / "s1.sock"))
        conn.sendall(Adoption("a", ENV).to_line())
        answer = json.loads(conn.makefile("rb").readline())
        assert answer["adopted"] is True
        # ... and it goes away without its `go`.
    assert ask(folder / "s1.sock", Adoption("b", ENV), timeout_s=10) is not None
    running.thread.join(10)
    assert running.adopted == [Adoption("b", ENV)]


def test_a_spare_that_dies_while_adopting_leaves_its_asker_to_start_cold(folder: Path) -> None:
    """The spare read the request and died before its answer: the asker gets None (start
    the engine cold), never a pid of a process that is not the engine."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(folder / "s1.sock"))
    listener.listen(1)

    def die() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()  # what the kernel does for a process killed now
        listener.close()

    dying = threading.Thread(target=die, name="dying-spare")
    dying.start()
    assert ask(folder / "s1.sock", Adoption("a", ENV), timeout_s=10) is None
    dying.join(10)


def test_two_askers_at_once_never_get_one_spare(folder: Path) -> None:
    running = Running(folder / "s1.sock")
    pids: dict[str, int | None] = {}
    askers = [
        threading.Thread(
            target=lambda e=engine: pids.__setitem__(e, ask(folder / "s1.sock", Adoption(e, ENV))),
            name=f"asker-{engine}",
        )
        for engine in ("a", "b")
    ]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(20)
    running.thread.join(10)
    assert sorted(p is None for p in pids.values()) == [False, True]
    (adopted,) = running.adopted
    assert adopted is not None
    assert pids[adopted.engine_id] is not None


def test_askers_try_the_warmest_spare_first_and_go_on_past_a_refusal(folder: Path) -> None:
    first = Running(folder / "s1.sock", accept=lambda _a: "not this one")
    second = Running(folder / "s2.sock")
    assert warm_spares(folder) == [folder / "s1.sock", folder / "s2.sock"]
    assert adopt(folder, Adoption("a", ENV)) is not None
    second.thread.join(10)
    assert second.adopted == [Adoption("a", ENV)]
    assert first.end() is None
    assert first.spare.state is SpareState.RETIRED
    assert warm_spares(folder) == []


def test_no_spare_means_a_cold_start(folder: Path) -> None:
    assert adopt(folder / "none", Adoption("a", ENV)) is None
    # A dead spare's socket file: nobody listens.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(folder / "dead.sock"))
    dead.close()
    assert adopt(folder, Adoption("a", ENV)) is None


def test_an_unreadable_request_is_refused_with_its_reason(folder: Path) -> None:
    running = Running(folder / "s1.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(folder / "s1.sock"))
        conn.sendall(b'{"engine_id": "", "env": {}}\n')
        answer = json.loads(conn.makefile("rb").readline())
    assert answer == {"adopted": False, "reason": "unreadable request: no engine_id"}
    assert running.end() is None


@pytest.mark.parametrize(
    "line",
    [b"[]", b'{"engine_id": "a"}', b'{"engine_id": "a", "env": {"X": 1}}', b"not json"],
)
def test_a_request_is_an_engine_id_and_an_environment_of_strings(line: bytes) -> None:
    with pytest.raises(ValueError, match=r"."):
        Adoption.from_line(line)


def test_a_spare_adopted_or_retired_goes_nowhere_else() -> None:
    assert TRANSITIONS[SpareState.ADOPTED] == frozenset()
    assert TRANSITIONS[SpareState.RETIRED] == frozenset()
    assert SpareState.ADOPTED not in TRANSITIONS[SpareState.WARM]  # only through an offer


class FakeConf:
    def __init__(self, runtime: set[str]) -> None:
        self.runtime = runtime
        self.values: dict[str, str] = {}

    def isModifiable(self, key: str) -> bool:
        return key in self.runtime

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class FakeSession:
    """What session_conflicts reads of a session: its SparkConf and which keys may change."""

    def __init__(self, started_with: dict[str, str], runtime: set[str]) -> None:
        self.conf = FakeConf(runtime)
        self.sparkContext = self
        self._started_with = started_with

    def getConf(self) -> FakeSession:
        return self

    def getAll(self) -> list[tuple[str, str]]:
        return list(self._started_with.items())


def test_a_spare_takes_an_engine_whose_static_settings_are_its_own() -> None:
    from twinstream.engine.spare import apply_runtime_conf, session_conflicts

    spark = FakeSession(
        {
            "spark.driver.memory": "1g",
            # Spark's own options before the session's: the same JVM.
            "spark.driver.extraJavaOptions": "--add-opens=java.base/java.lang=ALL-UNNAMED "
            "-XX:SharedArchiveFile=/x.jsa",
            "spark.app.name": "twinstream-spare",
        },
        runtime={"spark.sql.shuffle.partitions", "spark.sql.keyed"},
    )
    wanted = {
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/x.jsa",
        "spark.app.name": "twinstream-clicks-a",
        "spark.sql.shuffle.partitions": "1",
    }
    assert session_conflicts(spark, wanted) == []  # type: ignore[arg-type]
    bigger = {**wanted, "spark.driver.memory": "2g", "spark.driver.extraJavaOptions": "-Xss4m"}
    assert session_conflicts(spark, bigger) == [  # type: ignore[arg-type]
        "spark.driver.extraJavaOptions",
        "spark.driver.memory",
    ]
    spark.conf.values["spark.sql.keyed"] = "true"  # the warm-up's, not the engine's
    apply_runtime_conf(spark, wanted, ["spark.sql.keyed"])  # type: ignore[arg-type]
    assert spark.conf.values == {"spark.sql.shuffle.partitions": "1"}


def test_a_spare_in_a_folder_too_deep_for_a_socket_is_still_found(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    running = Running(deep / "s1.sock")
    assert warm_spares(deep) == [deep / "s1.sock"]
    assert ask(deep / "s1.sock", Adoption("a", ENV)) is not None
    running.thread.join(10)
    assert running.adopted == [Adoption("a", ENV)]
    assert not (deep / "s1.sock").exists()


def test_the_pid_file_names_the_engine_process_until_it_ends(tmp_path: Path) -> None:
    import subprocess
    import sys

    from twinstream.engine.spare import running_engine

    path = tmp_path / "engine.pid"
    assert running_engine(path) is None  # no file
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # As the adopted spare writes it: its pid and start time.
        import psutil

        path.write_text(f"{engine.pid} {psutil.Process(engine.pid).create_time()}\n")
        assert running_engine(path) == engine.pid
        # Another process under a reused pid is not the engine.
        path.write_text(f"{engine.pid} 12345.0\n")
        assert running_engine(path) is None
    finally:
        engine.kill()
        engine.wait(10)
    path.write_text(f"{engine.pid} {12345.0}\n")
    assert running_engine(path) is None
    path.write_text("garbage")
    assert running_engine(path) is None


def test_a_process_that_stands_for_an_adopted_engine_passes_a_stop_on_and_ends_with_it(
    tmp_path: Path,
) -> None:
    """What supervisord's engine program does once a spare is the engine: its SIGTERM stops
    the engine, and it ends when the engine does (1 when the engine died unasked, so that
    the supervisor starts it again)."""
    import signal
    import subprocess
    import sys

    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "time.sleep(60)\n"
    )
    follower = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from twinstream.engine.spare import follow\n"
        "sys.exit(follow(int(sys.argv[1]), 'a'))\n"
    )
    for stop_by in ("the supervisor", "a kill -9"):
        engine = subprocess.Popen([sys.executable, "-c", script])
        stand_in = subprocess.Popen(
            [sys.executable, "-c", follower, str(engine.pid)], stderr=subprocess.PIPE
        )
        try:
            # Its first line comes once its signal handlers are in place.
            assert stand_in.stderr is not None
            assert b"stands for it" in stand_in.stderr.readline()
            if stop_by == "the supervisor":
                stand_in.send_signal(signal.SIGTERM)
                assert engine.wait(10) == 0  # the engine was asked, and stopped
                assert stand_in.wait(10) == 0
            else:
                engine.kill()
                engine.wait(10)
                assert stand_in.wait(10) == 1
        finally:
            for proc in (engine, stand_in):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
