"""Start one Twinstream engine: `python spark_jobs/engine.py --engine-id a`.

Configuration comes from the TWINSTREAM_* environment (see twinstream.platform.settings) and the
pipelines file: the engine runs the pipeline whose engines include it (engine ids are the
stack's, twinstream.platform.registry.for_engine), so every engine of a stack shares one
environment. The engine serves its admin API, starts the streaming query from its own
checkpoint, joins the election, and runs until SIGTERM or SIGINT, when it leaves the
election first so that a standby takes over at once, then stops its query.

`python spark_jobs/engine.py --spare <socket>` starts a warm spare instead
(twinstream.engine.spare): its JVM, session and a warm-up of the framework's plan, then it
listens on the socket and becomes the engine the first asker names, with the asker's whole
environment, keeping its pid and its warm session. It runs no user code before that.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import uvicorn

from twinstream.contract import ContractError, Pipeline
from twinstream.engine import spare
from twinstream.engine.api import Conflict, create_app
from twinstream.engine.app import Engine, engine_session_args
from twinstream.engine.clients import EngineClients
from twinstream.engine.priority import raise_every_thread
from twinstream.engine.spark import pin_code
from twinstream.platform import registry, storage
from twinstream.platform.settings import EngineSettings, SettingsError, load

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")
PID_FILE = "engine.pid"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--engine-id", help="an engine of a pipeline of the pipelines file")
    which.add_argument(
        "--keep-spares",
        metavar="COUNT",
        type=int,
        help="keep COUNT warm spares on this machine, in the settings' spares folder "
        "(twinstream.engine.spare_keeper)",
    )
    which.add_argument(
        "--spare",
        metavar="SOCKET",
        type=Path,
        help="start as a warm spare listening on this Unix socket, and become the engine "
        "the first asker names (twinstream.engine.spare)",
    )
    parser.add_argument(
        "--no-start", action="store_true", help="serve the admin API with the pipeline stopped"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="start the engine in this process, asking no warm spare to become it",
    )
    args = parser.parse_args(argv)
    # `kill -USR1 <pid>` writes every Python thread's stack to the engine's log (stderr)
    # and the engine goes on: how a stalled main loop or batch is seen without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if args.keep_spares is not None:
        _configure_logging("spares")
        return keep_spares(args.keep_spares)
    if args.spare is not None:
        _configure_logging(f"spare:{args.spare.stem}")
        adopted = run_spare(args.spare)
        if adopted is None:
            return 0
        engine_id, spark = adopted
        return serve(engine_id, no_start=False, spark=spark)
    _configure_logging(args.engine_id)
    if not (args.no_start or args.cold):
        followed = follow_or_adopt(args.engine_id)
        if followed is not None:
            return followed
    return serve(args.engine_id, args.no_start)


def follow_or_adopt(engine_id: str) -> int | None:
    """Under a supervisor (supervisord restarts an engine that died): when the engine
    already runs in an adopted spare, stand for it; else ask this machine's warm spares to
    become it and stand for the one that does. None: start it here, cold."""
    try:
        settings = registry.for_engine(load(EngineSettings), engine_id)
    except SettingsError:
        return None  # serve() says what is wrong
    pid_file = settings.engine_dir(engine_id) / PID_FILE
    running = spare.running_engine(pid_file)
    if running is None and settings.warm_spares > 0:
        running = spare.adopt(settings.spares_dir, spare.Adoption(engine_id, dict(os.environ)))
    if running is None:
        return None
    return spare.follow(running, engine_id)


def _configure_logging(name: str) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s engine={name} %(name)s: %(message)s",
        force=True,
    )
    for noisy in ("py4j", "kazoo.client", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _stop_on_signals(what: str) -> threading.Event:
    """An event SIGTERM and SIGINT set (logged with `what` they do)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger(__name__).warning("signal %s: %s", signum, what)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def keep_spares(count: int) -> int:
    """Keep `count` warm spares in the settings' spares folder until SIGTERM or SIGINT."""
    from twinstream.engine.spare_keeper import Keeper

    try:
        settings = load(EngineSettings)
    except SettingsError as exc:
        print(f"spares: {exc}", file=sys.stderr)
        return 2
    stop = _stop_on_signals("stopping the spares")
    Keeper(settings.spares_dir, count, os.environ).run(stop)
    return 0


def run_spare(path: Path) -> tuple[str, SparkSession] | None:
    """Warm a session, listen on `path`, and once an asker confirms, take its environment as
    this process's own: the engine id and the warm session. None: stopped while a spare."""
    stop = _stop_on_signals("the spare stops")
    try:
        own = load(EngineSettings)
    except SettingsError as exc:
        print(f"spare {path}: {exc}", file=sys.stderr)
        return None
    started = time.monotonic()
    spark = _warm_session(own, f"spare {path}")
    waiting = spare.Spare(path)
    if stop.is_set():
        waiting.retire()
        return None
    waiting.listen()

    def accept(adoption: spare.Adoption) -> str | None:
        def conflicts() -> list[str]:
            settings = registry.for_engine(load(EngineSettings), adoption.engine_id)
            return _static_conflicts(spark, settings, adoption.engine_id, None)

        try:
            found = _with_environment(adoption.env, conflicts)
        except (SettingsError, ContractError, FileNotFoundError) as exc:
            return str(exc)
        return f"static Spark settings differ: {', '.join(found)}" if found else None

    keeper = os.getppid()
    # A spare whose keeper is gone (killed: it stopped none of its spares) retires.
    adoption = waiting.wait(accept, lambda: stop.is_set() or os.getppid() != keeper)
    if adoption is None:
        return None
    # The engine's whole environment from here on: settings, credentials, the pipeline's
    # folder on PYTHONPATH (the Python workers' path below).
    os.environ.clear()
    os.environ.update(adoption.env)
    _configure_logging(adoption.engine_id)
    # Still at the spare's low priority: the engine raises itself once it is in sync or
    # leads (twinstream.engine.priority), so that its catch-up never slows the active.
    logging.getLogger(__name__).info(
        "spare %s adopted as engine %s (warm for %.0f s); it catches up niced",
        path,
        adoption.engine_id,
        time.monotonic() - started,
    )
    return adoption.engine_id, spark


def _warm_session(settings: EngineSettings, what: str) -> SparkSession:
    """A session as an engine's, warmed on the framework's plan (no user code)."""
    from twinstream.engine.pipeline import spark_conf, warm_up
    from twinstream.engine.spark import session

    conf = {**spark_conf(spare.WARM_UP_PIPELINE), "spark.driver.memory": settings.engine_heap}
    started = time.monotonic()
    spark = session(settings, "twinstream-spare", conf=conf)
    with tempfile.TemporaryDirectory(prefix="twinstream-spare-") as folder:
        rows = warm_up(
            spark, settings, spare.WARM_UP_PIPELINE, Path(folder), settings.warm_up_records or 500
        )
    logging.getLogger(__name__).info(
        "%s warm in %.1f s (%s warm-up rows)", what, time.monotonic() - started, rows
    )
    return spark


def _with_environment(env: Mapping[str, str], make: Callable[[], T]) -> T:
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return make()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _static_conflicts(
    spark: SparkSession, settings: EngineSettings, engine_id: str, pipeline: Pipeline | None
) -> list[str]:
    """The static Spark settings the engine's own session would have that the spare's
    lacks (twinstream.engine.spare.session_conflicts); `pipeline` None: the settings'
    alone, before its module is imported."""
    from twinstream.engine.spark import session_conf

    wanted = session_conf(settings, *engine_session_args(settings, engine_id, pipeline))
    return spare.session_conflicts(spark, wanted)


def _adopt_session(
    spark: SparkSession, settings: EngineSettings, engine_id: str, pipeline: Pipeline
) -> bool:
    """Fit a spare's warm session to the engine: its runtime settings set, its Python
    workers' path the pipeline's. False when the pipeline's own settings need a JVM of its
    own (a static one differs)."""
    from twinstream.engine.pipeline import KEYED_CONF, spark_conf
    from twinstream.engine.spark import session_conf

    conflicts = _static_conflicts(spark, settings, engine_id, pipeline)
    if conflicts:
        logging.getLogger(__name__).warning(
            "engine %s pipeline %s: its static Spark settings %s differ from the spare's: "
            "starting a JVM of its own",
            engine_id,
            settings.pipeline,
            ", ".join(conflicts),
        )
        return False
    wanted = session_conf(settings, *engine_session_args(settings, engine_id, pipeline))
    spare.apply_runtime_conf(spark, wanted, [*KEYED_CONF, *spark_conf(spare.WARM_UP_PIPELINE)])
    # Python workers run with the JVM's environment (the spare's) and the session's own:
    # the pipeline's folder must be on the path they import its transform from.
    spark.sparkContext.environment["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    return True


def serve(engine_id: str, no_start: bool, spark: SparkSession | None = None) -> int:
    """Run the engine `engine_id` until SIGTERM or SIGINT; `spark`: an adopted spare's
    session."""
    try:
        settings = registry.for_engine(load(EngineSettings), engine_id)
        port = settings.engine_admin_port(engine_id)
        token = settings.secret("admin_token")
        # Shared storage the engine's Python cannot reach fails here, named, not at the
        # first persist or restore.
        storage.check(settings.checkpoint_dir(engine_id))
        storage.check(settings.snapshot_dir)
        # Which process is this engine: a restarted supervisor's program stands for it.
        spare.write_pid_file(settings.engine_dir(engine_id) / PID_FILE)
        pipeline = registry.load(settings)
        # Read right after the import: the version of the code the engine runs.
        version = registry.code_version(settings, pipeline)
        # The code the engine runs is the code it imported, whatever is written on disk later.
        pinned = pin_code(registry.module_spec(settings)[0])
        logging.getLogger(__name__).info(
            "engine %s pipeline %s: version %s; its Python workers run %s as loaded",
            engine_id,
            settings.pipeline,
            version,
            ", ".join(pinned),
        )
        if spark is not None and not _adopt_session(spark, settings, engine_id, pipeline):
            from twinstream.engine.spark import stop_session

            # The same pid, a JVM of its own: the asker's supervisor still has the engine.
            stop_session(spark)
            # A cold engine is never niced (exec keeps the spare's niceness).
            raise_every_thread()
            os.execv(sys.executable, [sys.executable, __file__, "--engine-id", engine_id, "--cold"])  # noqa: S606 - this very program, the same argv a supervisor gives
        engine = Engine(
            settings,
            engine_id,
            pipeline,
            EngineClients.from_settings(settings, engine_id, version),
            spark=spark,
        )
    except (SettingsError, ContractError, storage.StorageError) as exc:
        print(f"engine {engine_id}: {exc}", file=sys.stderr)
        return 2

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, token, docs=settings.admin_api_docs),
            host=settings.bind_host,
            port=port,
            log_level="warning",
            # https with the engine's certificate when it has one (settings checked that
            # both files load); plain HTTP otherwise, the token readable on the wire.
            ssl_certfile=settings.admin_tls_certfile or None,
            ssl_keyfile=settings.admin_tls_keyfile or None,
        )
    )
    engine.open()
    api = threading.Thread(target=server.run, name="admin-api", daemon=True)
    api.start()

    stop = _stop_on_signals("shutting down")

    if not no_start:
        # Not started (its reason is logged and on GET /pipeline): the engine keeps serving
        # its admin API, where a restore or a start fixes it.
        with contextlib.suppress(Conflict):
            engine.start()
    while not stop.wait(1.0):
        engine.check_query()
        engine.track_active_position()
        engine.publish_standing()
        engine.log_batch_timings(settings.batch_timings_log_s)
    engine.close()
    server.should_exit = True
    api.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
