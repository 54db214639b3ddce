"""The operator's page inside the Airflow UI: a FastAPI app the Airflow API server mounts
(plugins/twinstream_operator.py) at PREFIX.

- `GET /`: the page (static HTML and script; it polls the overview every few seconds).
- `GET /api/overview`: the deployment as `twinstream.ops.overview.Overview` (JSON; each
  engine with its agreement, a disagreement with its msg_id, the active's transaction and
  both sides' rows, which the page shows in full), the
  engines read through their admin APIs with the tokens of their Airflow connections, the
  publisher adapters from their ZooKeeper status nodes (`AdapterReader`, as `twinstream
  status` reads them).
- `GET /api/timeline/{pipeline}`: the pipeline's last 15 minutes for its chart, its
  engines' GET /timeline merged into one `twinstream.engine.timeline.PipelineTimeline` (JSON).
- `GET /datadocs/{pipeline}/{page}`: the pipeline's Great Expectations Data Docs, rewritten
  to load nothing from the internet (`datadocs.offline`); `GET /vendor/{file}` serves what
  they load instead.

Every route requires Airflow's own login (`auth`: the API server's dependency, which reads
the `_token` cookie the UI's iframe sends); the actions on the page are plain DAG runs
triggered through Airflow's REST API by the browser, so Airflow checks and logs them as
any other trigger.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response

from twinstream.engine import timeline as timelines
from twinstream.engine.spare_keeper import read_status
from twinstream.ops.audit import data_docs_site
from twinstream.ops.operator_ui.datadocs import VENDOR, external_resources, offline, safe_file
from twinstream.ops.overview import (
    AdapterView,
    AuditView,
    EngineFactory,
    Overview,
    SnapshotView,
    latest_audit,
    overview,
    snapshot_views,
)
from twinstream.platform import registry
from twinstream.platform.settings import CommonSettings, SettingsError, TaskSettings, load

log = logging.getLogger(__name__)

PREFIX = "/twinstream"
STATIC = Path(__file__).parent / "static"
# Snapshots are verified (checksums) and Kafka asked for log-start offsets at most this
# often; the engines are read on every request.
HISTORY_TTL_S = 30.0
# The DAGs the page's buttons trigger: dag_id -> what the button says.
ACTIONS = {
    "persist_standby_state": "Persist now",
    "restore_and_resync": "Restore and resync",
    "failover_drill": "Failover drill",
    "deploy_pipeline": "Deploy the code on disk",
}


@dataclass
class _History:
    at: float
    snapshots: list[SnapshotView]
    audit: AuditView | None


def _task_settings() -> TaskSettings:
    return load(TaskSettings)


@dataclass
class Sources:
    """Where the page's facts come from; the plugin gives Airflow's, tests their own."""

    # The page runs in Airflow's API server: an Airflow process, it reads the tasks' groups.
    settings: Callable[[], TaskSettings] = _task_settings
    # (pipeline's settings, engine id) -> its admin API's client.
    engines: EngineFactory | None = None
    log_starts: Callable[[CommonSettings], Mapping[int, int] | None] | None = None
    # (pipeline's settings) -> its publisher adapters (twinstream.ops.overview.AdapterReader).
    adapters: Callable[[CommonSettings], list[AdapterView]] | None = None
    # (pipeline's settings) -> its last deploy in a line (AdapterReader.last_deploy).
    deploys: Callable[[CommonSettings], str | None] | None = None
    clock: Callable[[], float] = time.time
    _history: dict[str, _History] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stack: dict[str, TaskSettings] | None = None
    # The pipelines file's (path, mtime, size) when _stack was read from it.
    _stamp: tuple[str, int, int] | None = None

    def pipelines(self) -> dict[str, TaskSettings]:
        """The stack's pipelines, read again whenever the pipelines file changes (its
        modification time or size): `up` adds a pipeline without restarting Airflow, and
        the page shows it at its next poll. A changed file that does not read (a typo being
        edited) keeps the last good list and logs why; `up` refuses such a file by name."""
        settings = self.settings()
        path = settings.pipelines_file
        try:
            stat = path.stat()
            stamp: tuple[str, int, int] | None = (str(path), stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None  # registry.stack says what is wrong with a missing file
        with self._lock:
            if self._stack is not None and stamp is not None and stamp == self._stamp:
                return self._stack
            try:
                stack = dict(registry.stack(settings))
            except SettingsError as exc:
                if self._stack is None:
                    raise
                log.warning("pipelines file %s changed but does not read: %s", path, exc)
                return self._stack
            if self._stack is not None and set(stack) != set(self._stack):
                log.info("pipelines file %s changed: pipelines %s", path, ", ".join(stack))
            # A removed pipeline's cached history goes with it.
            self._history = {n: h for n, h in self._history.items() if n in stack}
            self._stack, self._stamp = stack, stamp
            return stack

    def overview(self) -> Overview:
        if self.engines is None:
            raise RuntimeError("no engine client factory given")
        seen = overview(
            self.pipelines(),
            self.engines,
            clock=self.clock,
            with_history=False,
            adapters=self.adapters,
            deploys=self.deploys,
            spares=lambda: read_status(self.settings().spares_dir),
        )
        for pipeline in seen.pipelines:
            history = self.history(pipeline.name)
            pipeline.snapshots = history.snapshots
            pipeline.add_audit(history.audit)
        return seen

    def timeline(self, name: str) -> timelines.PipelineTimeline:
        """The pipeline's engines' timelines merged (each engine asked on every call: a
        timeline is a few KB, and the page asks every few seconds)."""
        if self.engines is None:
            raise RuntimeError("no engine client factory given")
        return timelines.read(name, self.pipelines()[name], self.engines, self.clock)

    def history(self, name: str) -> _History:
        now = time.monotonic()
        with self._lock:
            cached = self._history.get(name)
            if cached is not None and now - cached.at < HISTORY_TTL_S:
                return cached
        settings = self.pipelines()[name]
        starts: Mapping[int, int] | None = None
        if self.log_starts is not None:
            try:
                starts = self.log_starts(settings)
            except Exception as exc:  # restorability is then shown as unknown
                log.warning("pipeline %s: inbound log-start offsets unknown: %s", name, exc)
        history = _History(
            now,
            snapshot_views(settings, starts, self.clock()),
            latest_audit(settings.audit_dir),
        )
        with self._lock:
            self._history[name] = history
        return history

    def data_docs_root(self, name: str) -> Path:
        return data_docs_site(self.pipelines()[name].audit_dir)


def create_app(sources: Sources, auth: Callable[..., Any], prefix: str = PREFIX) -> FastAPI:
    """The plugin's app; `auth` is the dependency that admits a logged-in Airflow user."""
    app = FastAPI(
        title="Twinstream operator view",
        # The API server serves Airflow's own docs; this app's are of no use to an operator.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(auth)],
    )

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        html = (STATIC / "index.html").read_text()
        return HTMLResponse(html.replace("{{PREFIX}}", prefix))

    @app.get("/static/{name}")
    def static(name: str) -> FileResponse:
        path = safe_file(STATIC, name)
        if path is None:
            raise HTTPException(404, f"no file {name!r}")
        return FileResponse(path)

    @app.get("/api/overview")
    def api_overview() -> dict[str, Any]:
        seen = sources.overview()
        return {"overview": seen.model_dump(), "actions": ACTIONS, "ok": seen.ok}

    @app.get("/api/timeline/{pipeline}")
    def api_timeline(pipeline: str) -> dict[str, Any]:
        if pipeline not in sources.pipelines():
            raise HTTPException(404, f"no pipeline {pipeline!r}")
        return sources.timeline(pipeline).model_dump()

    @app.get("/vendor/{path:path}")
    def vendor(path: str) -> FileResponse:
        found = safe_file(VENDOR, path)
        if found is None:
            raise HTTPException(404, f"no vendored file {path!r}")
        # Versioned paths: they never change.
        return FileResponse(found, headers={"Cache-Control": "max-age=86400"})

    @app.get("/datadocs/{pipeline}/{path:path}")
    def data_docs(pipeline: str, path: str) -> Response:
        if pipeline not in sources.pipelines():
            raise HTTPException(404, f"no pipeline {pipeline!r}")
        root = sources.data_docs_root(pipeline)
        found = safe_file(root, path or "index.html")
        if found is None:
            raise HTTPException(
                404,
                f"no Data Docs page {path!r} for pipeline {pipeline}: run audit_output_topic "
                "to write them",
            )
        if found.suffix != ".html":
            return FileResponse(found)
        html = offline(
            found.read_text(errors="replace"), f"{prefix}/vendor", f"{prefix}/datadocs/{pipeline}"
        )
        left = external_resources(html)
        if left:
            log.warning("Data Docs page %s still loads from the internet: %s", found, left[:3])
        return HTMLResponse(html)

    return app
