"""The engine admin API: FastAPI, OpenAPI at /docs, bearer-token auth on everything but
/healthz. Errors are JSON with a reason, never a stack trace."""

from __future__ import annotations

import hmac
import logging
from typing import Any, Protocol

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

import twinstream
from twinstream.snapshot import Manifest, SnapshotError

log = logging.getLogger(__name__)


class ServerInfo(BaseModel):
    engine_id: str
    role: str
    pid: int
    zk_state: str
    epoch: int
    version: str


class QuarantinedOffset(BaseModel):
    msg_id: int
    reason: str
    partition: int = 0


class RepairInfo(BaseModel):
    """A range no buffer covered at a takeover, recomputed and published; `seconds` is
    null while the repair is in progress."""

    first: int
    last: int
    seconds: float | None
    partition: int = 0


class UncoveredRange(BaseModel):
    """msg_id first..last of an inbound partition: in no buffer at a takeover, and not
    recomputed (missing from the output)."""

    partition: int
    first: int
    last: int


class PipelineInfo(BaseModel):
    state: str
    reason: str
    last_msg_id_processed: int | None
    last_msg_id_published: int | None
    lag: int | None
    buffer_fill: int
    buffer_size: int
    in_sync: bool
    uncovered_ranges: list[UncoveredRange]
    # Rows the active could not publish yet (at most max_buffered_msgs before it pauses).
    unpublished: int = 0
    # Why the query is paused for backpressure, if it is (GET /pipeline shows it as such).
    paused: str | None = None
    # The pipeline's quarantined inbound offsets (shared by its engines through ZooKeeper),
    # each published as a dead letter with its reason.
    quarantined: list[QuarantinedOffset] = Field(default_factory=list)
    repairs: list[RepairInfo] = Field(default_factory=list)
    # Replay progress while restoring (Spark's processedRowsPerSecond of the last batch).
    events_per_s: float | None = None
    # The snapshot id (or "cold") the running pipeline was restored from, if any.
    restored_from: str | None = None
    # Per inbound partition: the last msg_id processed (buffered), and the last published
    # as this engine knows it. With one partition, the last_msg_id_* fields say the same.
    processed: dict[int, int] = Field(default_factory=dict)
    published: dict[int, int] = Field(default_factory=dict)


class RestoreRequest(BaseModel):
    snapshot: str = Field(
        default="latest",
        description='a snapshot id, "latest" (the newest valid one) or "cold" (rebuild from '
        "the inbound offset at now - window retention)",
        pattern=r"^[A-Za-z0-9_.:-]{1,200}$",
    )


class RestoreReport(BaseModel):
    snapshot: str
    # Partition 0's; `next_offsets` and `log_start_offsets` have every partition's.
    next_offset: int
    log_start_offset: int
    pipeline: PipelineInfo
    next_offsets: dict[int, int] = Field(default_factory=dict)
    log_start_offsets: dict[int, int] = Field(default_factory=dict)


class BufferedRow(BaseModel):
    msg_id: int
    kind: str
    key: str | None
    value: str
    partition: int = 0


class Control(Protocol):
    """What the API needs from an engine (a fake in unit tests)."""

    def server_info(self) -> ServerInfo: ...
    def pipeline_info(self) -> PipelineInfo: ...
    def start_pipeline(self) -> None: ...
    def stop_pipeline(self) -> None: ...
    def persist(self) -> Manifest: ...
    def restore(self, requested: str) -> RestoreReport: ...
    def buffer_tail(self, last: int) -> list[BufferedRow]: ...
    def metrics(self) -> bytes: ...


class Conflict(Exception):
    """The request does not fit the engine's state (409 with the reason)."""


def create_app(control: Control, token: str) -> FastAPI:
    if not token:
        raise ValueError("the admin API needs a token (TWINSTREAM_ADMIN_TOKEN)")
    app = FastAPI(
        title="Twinstream engine admin API",
        version=twinstream.__version__,
        description="Role, progress and control of one Twinstream engine.",
    )
    bearer = HTTPBearer(auto_error=False)

    def authorized(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if creds is None:
            raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)")
        if not hmac.compare_digest(creds.credentials.encode(), token.encode()):
            raise HTTPException(401, "wrong bearer token")

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"reason": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Conflict)
    async def conflict(_request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"reason": str(exc)}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse({"reason": f"invalid request: {problems}"}, status_code=422)

    @app.exception_handler(SnapshotError)
    async def unusable_snapshot(_request: Request, exc: SnapshotError) -> JSONResponse:
        return JSONResponse({"reason": str(exc)}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.error("admin API request failed: %s", exc, exc_info=exc)
        return JSONResponse({"reason": f"{type(exc).__name__}: {exc}"}, status_code=500)

    auth = [Depends(authorized)]

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/server", dependencies=auth)
    def server() -> ServerInfo:
        return control.server_info()

    @app.get("/pipeline", dependencies=auth)
    def pipeline() -> PipelineInfo:
        return control.pipeline_info()

    @app.post("/pipeline/stop", dependencies=auth)
    def stop() -> PipelineInfo:
        control.stop_pipeline()
        return control.pipeline_info()

    @app.post("/pipeline/start", dependencies=auth)
    def start() -> PipelineInfo:
        control.start_pipeline()
        return control.pipeline_info()

    @app.post("/pipeline/persist", dependencies=auth)
    def persist() -> Manifest:
        """Standby only (409 on the active): snapshot the checkpoint and the buffer."""
        return control.persist()

    @app.post("/pipeline/restore", dependencies=auth)
    def restore(request: RestoreRequest) -> RestoreReport:
        """Stopped pipeline only (409 otherwise); 422 for a snapshot that must not be used."""
        return control.restore(request.snapshot)

    @app.get("/pipeline/buffer", dependencies=auth)
    def buffer(last: int = Query(default=100, ge=1, le=1_000_000)) -> list[BufferedRow]:
        """The newest `last` output rows in the engine's ring buffer, in msg_id order."""
        return control.buffer_tail(last)

    @app.get("/metrics", dependencies=auth, response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(control.metrics(), media_type="text/plain; version=0.0.4")

    return app
