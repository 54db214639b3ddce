"""The engine admin API: FastAPI, OpenAPI at /docs, bearer-token auth on everything but
/healthz. Errors are JSON with a reason, never a stack trace."""

from __future__ import annotations

import hmac
import logging
from typing import Any, Protocol

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

import twinstream

log = logging.getLogger(__name__)


class ServerInfo(BaseModel):
    engine_id: str
    role: str
    pid: int
    zk_state: str
    epoch: int
    version: str


class PipelineInfo(BaseModel):
    state: str
    reason: str
    last_msg_id_processed: int | None
    last_msg_id_published: int | None
    lag: int | None
    buffer_fill: int
    buffer_size: int
    in_sync: bool
    uncovered_ranges: list[tuple[int, int]]


class Control(Protocol):
    """What the API needs from an engine (a fake in unit tests)."""

    def server_info(self) -> ServerInfo: ...
    def pipeline_info(self) -> PipelineInfo: ...
    def start_pipeline(self) -> None: ...
    def stop_pipeline(self) -> None: ...
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

    @app.get("/metrics", dependencies=auth, response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(control.metrics(), media_type="text/plain; version=0.0.4")

    return app
