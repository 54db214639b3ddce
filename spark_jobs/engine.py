"""Start one Twinstream engine: `python spark_jobs/engine.py --engine-id a`.

Configuration comes from the TWINSTREAM_* environment (see twinstream.platform.settings) and the
pipelines file: the engine runs the pipeline whose engines include it (engine ids are the
stack's, twinstream.platform.registry.for_engine), so every engine of a stack shares one
environment. The engine serves its admin API, starts the streaming query from its own
checkpoint, joins the election, and runs until SIGTERM or SIGINT, when it leaves the
election first so that a standby takes over at once, then stops its query.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import signal
import sys
import threading

import uvicorn

from twinstream.contract import ContractError
from twinstream.engine.api import Conflict, create_app
from twinstream.engine.app import Engine
from twinstream.engine.clients import EngineClients
from twinstream.platform import registry, storage
from twinstream.platform.settings import EngineSettings, SettingsError, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--engine-id", required=True, help="an engine of a pipeline of the pipelines file"
    )
    parser.add_argument(
        "--no-start", action="store_true", help="serve the admin API with the pipeline stopped"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s engine={args.engine_id} %(name)s: %(message)s",
    )
    for noisy in ("py4j", "kazoo.client", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # `kill -USR1 <pid>` writes every Python thread's stack to the engine's log (stderr)
    # and the engine goes on: how a stalled main loop or batch is seen without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        settings = registry.for_engine(load(EngineSettings), args.engine_id)
        port = settings.engine_admin_port(args.engine_id)
        token = settings.secret("admin_token")
        # Shared storage the engine's Python cannot reach fails here, named, not at the
        # first persist or restore.
        storage.check(settings.checkpoint_dir(args.engine_id))
        storage.check(settings.snapshot_dir)
        pipeline = registry.load(settings)
        # Read right after the import: the version of the code the engine runs.
        version = registry.code_version(settings, pipeline)
        logging.getLogger(__name__).info(
            "engine %s pipeline %s: version %s", args.engine_id, settings.pipeline, version
        )
        engine = Engine(
            settings,
            args.engine_id,
            pipeline,
            EngineClients.from_settings(settings, args.engine_id, version),
        )
    except (SettingsError, ContractError, storage.StorageError) as exc:
        print(f"engine {args.engine_id}: {exc}", file=sys.stderr)
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

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger(__name__).warning("signal %s: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if not args.no_start:
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
