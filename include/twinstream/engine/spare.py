"""A warm spare: an engine process started ahead of need, past its JVM's start, its Spark
session and a warm-up query, that becomes the engine it is asked to be.

Guarantee: a spare becomes at most one engine, once, and only after its asker has confirmed
that it took the answer. The handshake on the spare's Unix socket is one request (the engine
id and the whole environment the engine would have started with), one answer (adopted, with
the spare's pid, or refused with the reason), then the asker's `go`. A spare that sees no
`go` within `confirm_s` (its asker died, timed out, went elsewhere) stays a spare; an asker
that does not get a whole answer, or cannot send its `go`, starts its engine cold. So a lost
message costs the spare's warmth, never two processes under one identity. A spare listens
only once it is warm (no socket: still warming, or adopted), serves one asker at a time, and
removes its socket before it becomes the engine: a second asker finds no spare there.

Which identity a spare takes is its asker's choice, never the spare's: the engines' own
supervisor (`make up`'s supervisord through the engine's start, a test's harness) asks when
it would otherwise start a cold engine, so a spare never races an engine it replaces.

What it saves (docs/profile.md): the JVM's start, the session and the first jobs' class
loading and JIT, ~15-40 s of two busy cores; the adopted engine still reads its own
checkpoint and catches up, at a warm engine's speed.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from twinstream.contract import Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# A request or an answer is one JSON line, an environment of a few kilobytes.
_MAX_LINE = 1 << 20
# How far below the engines a spare runs until it is adopted (`nice -n`): its JVM's start and
# warm-up never take the cores from running engines.
SPARE_NICENESS = 10
# sockaddr_un's sun_path: 108 bytes with the terminating NUL.
_MAX_SOCKET_PATH = 108


class SpareState(enum.StrEnum):
    WARMING = "warming"
    """Starting its JVM and session and running its warm-up: no socket yet."""
    WARM = "warm"
    """Listening for an asker."""
    OFFERED = "offered"
    """Answered an asker "adopted" and waits for its `go`."""
    ADOPTED = "adopted"
    """Became the engine it was asked to be (its socket removed)."""
    RETIRED = "retired"
    """Stopped being a spare without becoming an engine (asked to stop)."""


# Where each state may go (the one table of a spare's lifecycle).
TRANSITIONS: Mapping[SpareState, frozenset[SpareState]] = {
    SpareState.WARMING: frozenset({SpareState.WARM, SpareState.RETIRED}),
    SpareState.WARM: frozenset({SpareState.OFFERED, SpareState.RETIRED}),
    # `go`, or none in time (back to warm: the spare is still whole).
    SpareState.OFFERED: frozenset({SpareState.ADOPTED, SpareState.WARM}),
    SpareState.ADOPTED: frozenset(),
    SpareState.RETIRED: frozenset(),
}


@dataclass(frozen=True)
class Adoption:
    """What an asker wants a spare to become: the engine `engine_id`, run with `env` as its
    whole environment (its settings, credentials, pipeline file)."""

    engine_id: str
    env: Mapping[str, str]

    def to_line(self) -> bytes:
        return json.dumps({"engine_id": self.engine_id, "env": dict(self.env)}).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> Adoption:
        """Raises ValueError on anything but a request this module writes."""
        body = json.loads(line)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        engine_id, env = body.get("engine_id"), body.get("env")
        if not isinstance(engine_id, str) or not engine_id:
            raise ValueError("no engine_id")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError("env is not an object of strings")
        return cls(engine_id, env)


class Spare:
    """The spare's side of the handshake, on the socket `path`."""

    def __init__(self, path: Path, confirm_s: float = 10.0, read_s: float = 10.0) -> None:
        self.path = path
        self.confirm_s = confirm_s
        self.read_s = read_s
        self.state = SpareState.WARMING
        self._listener: socket.socket | None = None

    def _move(self, to: SpareState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise RuntimeError(f"a spare cannot go from {self.state} to {to}: a bug")
        log.info("spare %s: %s -> %s", self.path.name, self.state, to)
        self.state = to

    def listen(self) -> None:
        """Warm: from now on askers find the socket."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead spare's leftover: nobody listens on it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound under a temporary name, then renamed: an asker never connects to a socket
        # that is not listening yet.
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        if len(os.fsencode(temporary)) < _MAX_SOCKET_PATH:
            listener.bind(str(temporary))
        else:
            # A socket's path has at most 107 bytes: bound in the temporary folder, and
            # found through a link where askers look (they connect to its target).
            short = Path(tempfile.mkdtemp(prefix="twinstream-spare-")) / "s.sock"
            listener.bind(str(short))
            temporary.symlink_to(short)
        listener.listen(8)
        temporary.rename(self.path)
        self._listener = listener
        self._move(SpareState.WARM)

    def wait(
        self, accept: Callable[[Adoption], str | None], stop: Callable[[], bool] = lambda: False
    ) -> Adoption | None:
        """Serve askers until one confirms (its Adoption: the caller becomes that engine) or
        `stop()` says so (None). `accept` says why a request cannot be taken (a static Spark
        setting it would change, say), or None: it must change nothing."""
        listener = self._listener
        if listener is None:
            raise RuntimeError("listen() first")
        listener.settimeout(0.5)
        try:
            while not stop():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    adoption = self._serve(conn, accept)
                if adoption is not None:
                    return adoption
            self._move(SpareState.RETIRED)
            return None
        finally:
            self._close()

    def _serve(
        self, conn: socket.socket, accept: Callable[[Adoption], str | None]
    ) -> Adoption | None:
        conn.settimeout(self.read_s)
        try:
            adoption = Adoption.from_line(_read_line(conn))
        except (OSError, ValueError) as exc:
            log.warning("spare %s: a request it cannot read: %s", self.path.name, exc)
            _send(conn, {"adopted": False, "reason": f"unreadable request: {exc}"})
            return None
        reason = accept(adoption)
        if reason is not None:
            log.info("spare %s: refused engine %s: %s", self.path.name, adoption.engine_id, reason)
            _send(conn, {"adopted": False, "reason": reason})
            return None
        self._move(SpareState.OFFERED)
        conn.settimeout(self.confirm_s)
        try:
            _send(conn, {"adopted": True, "pid": os.getpid()}, strict=True)
            confirmed = _read_line(conn).strip() == b"go"
        except (OSError, ValueError):
            confirmed = False
        if not confirmed:
            log.warning(
                "spare %s: engine %s's asker never confirmed: still a spare",
                self.path.name,
                adoption.engine_id,
            )
            self._move(SpareState.WARM)
            return None
        # The keeper's note (twinstream.engine.spare_keeper): this process is an engine now,
        # never again a spare to count, stop or replace.
        note = adopted_note(self.path)
        note.write_text(
            json.dumps({"engine_id": adoption.engine_id, "pid": os.getpid(), "at": time.time()})
        )
        self._close()
        self._move(SpareState.ADOPTED)
        return adoption

    def _close(self) -> None:
        if self._listener is not None:
            # The socket's name first: no asker may connect once the spare has chosen.
            with contextlib.suppress(OSError):
                bound = self._listener.getsockname()
                if bound and Path(bound) != self.path:
                    Path(bound).unlink()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._listener.close()
            self._listener = None

    def retire(self) -> None:
        """Stop being a spare without becoming an engine (a spare asked to stop while it
        still warms)."""
        self._close()
        if self.state in (SpareState.WARMING, SpareState.WARM):
            self._move(SpareState.RETIRED)


def adopted_note(socket_path: Path) -> Path:
    """Where a spare says, once adopted, which engine it became (JSON: engine_id, pid, at)."""
    return socket_path.with_suffix(".adopted")


def ask(path: Path, adoption: Adoption, timeout_s: float = 30.0) -> int | None:
    """The asker's side: the pid of the spare at `path` that is now the engine, or None (no
    spare there, or it refused: the reason is logged), and the asker starts the engine cold."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        try:
            conn.connect(str(path.resolve()))
        except (FileNotFoundError, ConnectionRefusedError, TimeoutError):
            return None  # no warm spare listens there
        try:
            conn.sendall(adoption.to_line())
            answer = json.loads(_read_line(conn))
            if not isinstance(answer, dict) or answer.get("adopted") is not True:
                reason = answer.get("reason") if isinstance(answer, dict) else answer
                log.info("spare %s refused engine %s: %s", path.name, adoption.engine_id, reason)
                return None
            pid = int(answer["pid"])
            conn.sendall(b"go\n")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "spare %s: no whole answer for engine %s (%s): starting it cold",
                path.name,
                adoption.engine_id,
                exc,
            )
            return None
    return pid


def warm_spares(folder: Path) -> list[Path]:
    """The sockets of the warm spares in `folder`, oldest first (the warmest)."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("*.sock") if p.is_socket()]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def adopt(folder: Path, adoption: Adoption, timeout_s: float = 30.0) -> int | None:
    """Ask the warm spares of `folder` in turn; the pid of the one that became the engine, or
    None when none would (start it cold)."""
    for path in warm_spares(folder):
        pid = ask(path, adoption, timeout_s)
        if pid is not None:
            return pid
    return None


def write_pid_file(path: Path) -> None:
    """Say which process is the engine (its pid and start time: a pid the system reuses for
    another process is not the engine's)."""
    import psutil

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(f"{os.getpid()} {psutil.Process().create_time()}\n")
    temporary.rename(path)


def running_engine(path: Path) -> int | None:
    """The pid of the live process the pid file names, other than this one; else None."""
    import psutil

    try:
        pid_text, started = path.read_text().split()
        pid = int(pid_text)
        if pid != os.getpid() and psutil.Process(pid).create_time() == float(started):
            return pid
    except (OSError, ValueError, psutil.Error):
        pass
    return None


class StandIn:
    """Stands for the engine process `pid` (an adopted spare) to this process's supervisor:
    SIGTERM and SIGINT are passed on to it, and `ended` is set when it ends (a thread of its
    own, `stand-in`, waits on it). `asked`: a stop was passed on."""

    def __init__(self, pid: int, engine_id: str) -> None:
        self.pid = pid
        self.engine_id = engine_id
        self.ended = threading.Event()
        self.asked = threading.Event()

    def start(self) -> StandIn:
        import signal

        import psutil

        try:
            engine = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            self.ended.set()
            return self

        def forward(signum: int, _frame: object) -> None:
            self.asked.set()
            with contextlib.suppress(psutil.NoSuchProcess):
                engine.send_signal(signum)

        def wait() -> None:
            with contextlib.suppress(psutil.NoSuchProcess):
                engine.wait()
            log.warning(
                "engine %s (process %s) ended%s",
                self.engine_id,
                self.pid,
                " as asked" if self.asked.is_set() else "",
            )
            self.ended.set()

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        threading.Thread(target=wait, name="stand-in", daemon=True).start()
        log.info(
            "engine %s runs in process %s (an adopted warm spare; its log is that spare's): "
            "this process stands for it until it ends",
            self.engine_id,
            self.pid,
        )
        return self

    @property
    def exit_code(self) -> int:
        """0 when the engine was asked to stop, 1 otherwise: a supervisor restarts an
        engine that died."""
        return 0 if self.asked.is_set() else 1


def follow(pid: int, engine_id: str) -> int:
    """Stand for the engine process `pid` until it ends (`StandIn`); its exit code."""
    stand_in = StandIn(pid, engine_id).start()
    while not stand_in.ended.wait(0.5):
        pass
    return stand_in.exit_code


def session_conflicts(spark: SparkSession, conf: Mapping[str, str]) -> list[str]:
    """The settings of `conf` (a whole session's, `twinstream.engine.spark.session_conf`)
    that this session cannot take: static ones, fixed when its JVM started (memory, jars,
    JVM options, the master), whose value differs. Changes nothing."""
    current = dict(spark.sparkContext.getConf().getAll())
    return sorted(
        key
        for key, value in conf.items()
        if key != "spark.app.name"
        and not spark.conf.isModifiable(key)
        and not _same(key, current.get(key), value)
    )


def _same(key: str, current: str | None, wanted: str) -> bool:
    if current == wanted:
        return True
    # Spark puts its own JVM options (module openings, IPv4) before the session's.
    return key.endswith("JavaOptions") and current is not None and current.endswith(f" {wanted}")


def apply_runtime_conf(spark: SparkSession, conf: Mapping[str, str], keys: Iterable[str]) -> None:
    """Set what a new session would have been built with, for the settings a running session
    may change (`session_conflicts` has checked the rest); `keys` it would not set are
    unset, so that the warm-up's or a former pipeline's choices do not stay."""
    for key, value in conf.items():
        if spark.conf.isModifiable(key):
            spark.conf.set(key, value)
    for key in keys:
        if key not in conf and spark.conf.isModifiable(key):
            spark.conf.unset(key)


def _warm_up_transform(records: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return records.select("msg_id", "host", (F.col("value") * 2).alias("doubled"))


def _warm_up_sample(count: int, seed: int, broken_every: int) -> Iterable[bytes]:
    for i in range(count):
        yield json.dumps({"host": f"h-{(seed + i) % 97}", "value": float(i)}).encode()


WARM_UP_PIPELINE = Pipeline(
    name="spare-warm-up",
    schema="host STRING, value DOUBLE",
    transform=_warm_up_transform,
    key="host",
    partition_by="host",
    value=["host", "doubled"],
    sample=_warm_up_sample,
)
"""What a spare runs before it listens: no user's code (a spare must not import a
pipeline's module that may change on disk before it is adopted), the framework's whole
plan: the file source, validation, a transform, `foreachBatch`."""


def _read_line(conn: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("the connection closed before a whole line")
        chunks.append(chunk)
        size += len(chunk)
        if b"\n" in chunk:
            return b"".join(chunks).split(b"\n", 1)[0]
        if size > _MAX_LINE:
            raise ValueError("a line longer than a request")


def _send(conn: socket.socket, body: Mapping[str, object], strict: bool = False) -> None:
    try:
        conn.sendall(json.dumps(body).encode() + b"\n")
    except OSError:
        if strict:
            raise
