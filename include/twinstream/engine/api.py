"""The engine admin API: FastAPI, bearer-token auth on everything but its public pages
(public_paths(): /healthz, and the OpenAPI document and its Swagger UI at /openapi.json and
/docs unless turned off). Errors are JSON with a reason, never a stack trace.

Served over plain HTTP, or HTTPS when the engine has a certificate
(TWINSTREAM_ADMIN_TLS_CERTFILE and _KEYFILE, spark_jobs/engine.py): over plain HTTP the
token crosses the network readable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

import twinstream
from twinstream.core.agreement import difference_text
from twinstream.engine.snapshot import Manifest, SnapshotError
from twinstream.platform.http import token_problem
from twinstream.platform.metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

# The pages anyone who reaches the port may read, without the token: the liveness probe,
# and (unless create_app(docs=False)) the OpenAPI document and Swagger UI, which describe
# the endpoints but hold no engine data. Everything else, unknown paths included, is 401
# without the token. README ("Admin API") lists the same; a unit test holds both to it.
HEALTH_PATH = "/healthz"
DOCS_PATHS = ("/openapi.json", "/docs")
# The longest reason a 500 carries: the full error goes to the engine's log.
MAX_ERROR_REASON = 300


class ErrorReason(BaseModel):
    """Every error's body: what went wrong, in one line."""

    reason: str


class ServerInfo(BaseModel):
    engine_id: str
    role: str
    pid: int
    zk_state: str
    epoch: int
    # The platform's version (twinstream's package).
    version: str
    # The pipeline's code this engine loaded: its declared version and code digest
    # (twinstream.platform.versions), fixed for the engine's life; "" if unknown.
    pipeline_version: str = ""
    # The digest of the pipeline's code on disk now ("" if unknown), and whether it differs
    # from the one the engine loaded: the engine runs older (or newer) code than its files.
    code_on_disk: str = ""
    stale: bool = False
    # The shape of the pipeline's keyed state (Keyed.state, Spark DDL); "" for a transform,
    # whose state Spark keeps: a deploy whose new version keeps another shape rebuilds it.
    state_shape: str = ""
    # This engine's process was a warm spare that became it (twinstream.engine.spare): it
    # skipped a JVM's and a Spark session's start; False: it started cold.
    from_spare: bool = False


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


class TakeoverInfo(BaseModel):
    """One takeover by this engine, as it remembers it (its last few, newest first)."""

    epoch: int
    # When it won the election (UTC, ISO 8601).
    at: str
    # Winning to fenced, with the last published msg_id of each partition read.
    fence_and_read_s: float
    # Winning to its first committed transaction as active: the output's pause as this
    # engine sees it (None until it has published; the previous active's failure to its
    # session's expiry comes before and is not in it).
    first_commit_s: float | None = None
    # The engine that took over runs in a warm spare's process (it had been started from one
    # after a loss), not in one that started cold.
    from_spare: bool = False


class LagTrend(BaseModel):
    """The engine's lag over its last `window_s` seconds, as `twinstream.engine.lag_trend` judges
    it: `growing` only when the lag rose through the whole window (a burst the engine
    absorbs never counts)."""

    window_s: float
    # The lag at the window's oldest and newest samples.
    first: int
    last: int
    # The median lag of each quarter of the window, oldest first.
    quarters: list[int]
    growing: bool


def buffer_text(fills: Mapping[int, int], total: int | None, bound: int | None) -> str:
    """Each partition's buffered rows against the per-partition bound (num_buffered_msgs),
    e.g. "p0 9,800/10,000 · p1 10,000/10,000": the bound holds per partition, so a sum over
    partitions against it would read as an overflow. Without per-partition figures (an
    engine of an older version) the total alone, never against the bound."""
    if total is None or bound is None:
        return "-"
    if fills:
        return " · ".join(f"p{p} {n:,}/{bound:,}" for p, n in sorted(fills.items()))
    if total == 0:
        return f"0/{bound:,}"
    return f"{total:,} total"


class StandbyCover(BaseModel):
    """The active's standbys (twinstream.engine.readiness): those that could take over now
    and, for every other engine, why not; when none could, since when."""

    ready: list[str] = Field(default_factory=list)
    not_ready: dict[str, str] = Field(default_factory=dict)
    # None while a standby could take over; else when the active saw that none could.
    unprotected_since: str | None = None
    unprotected_s: float | None = None


class PipelineInfo(BaseModel):
    state: str
    reason: str
    last_msg_id_processed: int | None
    last_msg_id_published: int | None
    lag: int | None
    # Rows in the buffer over every partition; `buffer_fills` has each partition's, and
    # `buffer_size` is the bound of one partition (num_buffered_msgs), not of the sum.
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
    # Per inbound partition: the next offset the query will read (its last batch's end).
    # An engine restarted with its checkpoint at the topic's end has processed nothing
    # since (`processed` is empty) and yet has read everything: this says so.
    read_up_to: dict[int, int] = Field(default_factory=dict)
    takeovers: list[TakeoverInfo] = Field(default_factory=list)
    # Per inbound partition: the rows its buffer holds (against `buffer_size` each).
    buffer_fills: dict[int, int] = Field(default_factory=dict)
    # None until the engine has sampled its lag over a whole window (a minute after start).
    lag_trend: LagTrend | None = None
    # Whether this engine's rows equal the active's published ones (a standby's check).
    agreement: AgreementInfo = Field(default_factory=lambda: AgreementInfo())
    # The lag in seconds of the engine's own measured rate: what `in_sync` is judged by
    # (None until it measured a rate; then `in_sync` falls back to a count of records).
    lag_s: float | None = None
    # On the active only: which standbys could take over from it.
    standbys: StandbyCover | None = None

    def buffer_text(self) -> str:
        return buffer_text(self.buffer_fills, self.buffer_fill, self.buffer_size)

    def processed_positions(self) -> dict[int, int]:
        """Each partition's last processed msg_id (an engine of one partition may give
        only the scalar)."""
        return _positions(self.processed, self.last_msg_id_processed)

    def published_positions(self) -> dict[int, int]:
        """Each partition's last published msg_id, as this engine knows it."""
        return _positions(self.published, self.last_msg_id_published)


def _positions(per_partition: dict[int, int], alone: int | None) -> dict[int, int]:
    if per_partition:
        return dict(per_partition)
    return {} if alone is None else {0: alone}


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


class Difference(BaseModel):
    """The first msg_id where a standby's rows differ from what the active published for
    it: the active's transaction it lies in (`first`..`last` of `partition`, at `epoch`),
    and both sides' rows of that msg_id (none: a record without output)."""

    partition: int
    msg_id: int
    first: int
    last: int
    epoch: int | None = None
    active_rows: list[BufferedRow] = Field(default_factory=list)
    engine_rows: list[BufferedRow] = Field(default_factory=list)
    # When this engine found it (ISO 8601, UTC).
    found_at: str = ""

    def text(self) -> str:
        return difference_text(self.partition, self.msg_id, self.first, self.last, self.epoch)


class ShadowInfo(BaseModel):
    """A standby on other code than the active (a deploy's new version beside the old):
    what differs between their rows, reported, never barring it. `msg_ids_differing`
    counts the differing msg_ids of the `ranges_read_back` (differing ranges are read back
    from Kafka at most every few seconds); `examples` give both versions' rows of one."""

    active_version: str
    version: str
    ranges_compared: int = 0
    ranges_differing: int = 0
    rows_compared: int = 0
    ranges_read_back: int = 0
    msg_ids_differing: int = 0
    examples: list[Difference] = Field(default_factory=list)

    def text(self) -> str:
        """One line: `shadow of 1+aaa: 12 of 40 ranges differ (35 msg_ids in 3 read back)`."""
        return (
            f"shadow of {self.active_version}: {self.ranges_differing:,} of "
            f"{self.ranges_compared:,} ranges differ ({self.msg_ids_differing:,} msg_ids in "
            f"{self.ranges_read_back:,} read back; {self.rows_compared:,} rows compared)"
        )


class AgreementInfo(BaseModel):
    """Whether this engine's output rows equal the active's published ones
    (twinstream.core.agreement): each transaction's progress record carries a digest of its
    rows, and a standby compares it with the digest of its own rows of the same range.

    `state`: `agrees` (every range compared so far was equal), `disagrees` (one was not:
    `difference` names its first msg_id; sticky until the engine is restored or
    overridden), `unchecked` (nothing compared yet: a new standby, or the active, whose
    rows are the published ones), `shadow` (the active runs other code: `shadow` says what
    differs, and the engine stays eligible)."""

    state: str = "unchecked"
    # Per partition: the last msg_id of the newest range compared and equal.
    checked: dict[int, int] = Field(default_factory=dict)
    # Ranges compared equal, and ranges this engine could not compare (it no longer held
    # their rows, or never did: a restore, a restart).
    ranges_agreed: int = 0
    ranges_unchecked: int = 0
    difference: Difference | None = None
    # An operator let this engine lead although it disagrees (POST /pipeline/override).
    overridden: bool = False
    # State `shadow`: the active runs other code than this engine, and this is what differs.
    shadow: ShadowInfo | None = None

    @property
    def eligible(self) -> bool:
        """Whether the engine may win the election: not while it disagrees, unless
        overridden."""
        return self.state != "disagrees" or self.overridden


class TimelinePoint(BaseModel):
    """One bucket (`step_s` long) of an engine's timeline (`twinstream.engine.timeline`)."""

    # The bucket's start, epoch seconds.
    t: float
    # End-to-end latency (inbound record's Kafka timestamp to the commit that made it
    # visible) of the records this engine published in the bucket: None if it published none.
    p50_s: float | None
    p99_s: float | None
    published: int
    # The inbound rate (mean of the bucket's samples) and this engine's highest lag in it.
    in_per_s: float | None
    lag: int | None


class TimelineMark(BaseModel):
    """This engine won the election with `epoch` at `t` (epoch seconds)."""

    t: float
    epoch: int


class TimelineInfo(BaseModel):
    """The engine's own figures over its last `window_s` seconds, oldest first: only the
    buckets it reported anything in (an engine restarted has no history before it)."""

    window_s: float
    step_s: float
    # The engine's clock at the answer, epoch seconds.
    now: float | None = None
    points: list[TimelinePoint] = Field(default_factory=list)
    takeovers: list[TimelineMark] = Field(default_factory=list)


class EngineApi(Protocol):
    """An engine's admin operations, one name each, as its routes and their OpenAPI
    operations name them. The engine answers them in its own process
    (`twinstream.engine.app.Engine`), `EngineClient` over HTTP, fakes in unit tests; the
    DAGs, the CLI and the operator page speak to this and nothing else."""

    engine_id: str

    def server(self) -> ServerInfo: ...
    def pipeline(self) -> PipelineInfo: ...
    def timeline(self) -> TimelineInfo: ...
    def start(self) -> PipelineInfo: ...
    def stop(self) -> PipelineInfo: ...
    def persist(self) -> Manifest: ...
    def restore(self, snapshot: str) -> RestoreReport: ...
    def buffer(self, last: int) -> list[BufferedRow]: ...
    def metrics(self) -> str: ...
    def override(self) -> PipelineInfo: ...


class Conflict(Exception):
    """The request does not fit the engine's state (409 with the reason)."""


def public_paths(docs: bool = True) -> frozenset[str]:
    """The paths create_app(docs=...) serves without the token."""
    return frozenset({HEALTH_PATH, *(DOCS_PATHS if docs else ())})


def _unauthorized(reason: str) -> JSONResponse:
    return JSONResponse({"reason": reason}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class _TokenGate:
    """Refuses a request without the token before the app routes it or reads its body.

    A route's auth dependency alone runs after FastAPI has parsed the body and matched the
    route, so a caller without the token would get 400/422 for a malformed body and 404/405
    for a path or method the API lacks: the app would read input from, and answer, a
    stranger.
    """

    def __init__(self, app: ASGIApp, token: str, public: frozenset[str]) -> None:
        self.app = app
        self.token = token
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.public:
            problem = token_problem(Headers(scope=scope).get("authorization"), self.token)
            if problem is not None:
                await _unauthorized(problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _one_line(exc: Exception) -> str:
    """The error's type and the first line of its message: a Py4J or pydantic error's text
    goes on for lines (a Java stack trace, the offending values), which belong in the log."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    if len(text) > MAX_ERROR_REASON:
        text = text[: MAX_ERROR_REASON - 3] + "..."
    return text + (" (the engine's log has the rest)" if len(lines) > 1 else "")


# The error answers a route may give, for its OpenAPI description. The content is spelled
# out rather than given as a model: FastAPI would describe a model's answer in the route's
# own media type, text/plain for /metrics, where the error is JSON like everywhere else.
_ERROR_ANSWERS = {
    400: "a body that cannot be read",
    401: "missing or wrong bearer token",
    409: "the request does not fit the engine's state",
    422: "an invalid request (and for a restore, an unusable snapshot)",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    schema = ErrorReason.model_json_schema()
    return {
        code: {
            "description": _ERROR_ANSWERS[code],
            "content": {"application/json": {"schema": schema}},
        }
        for code in codes
    }


def create_app(engine: EngineApi, token: str, *, docs: bool = True) -> FastAPI:
    """The admin API of `engine`; `docs=False` serves no OpenAPI document or
    Swagger UI (TWINSTREAM_ADMIN_API_DOCS=false), leaving /healthz the one public page."""
    if not token:
        raise ValueError("the admin API needs a token (TWINSTREAM_ADMIN_TOKEN)")
    app = FastAPI(
        title="Twinstream engine admin API",
        version=twinstream.__version__,
        description="Role, progress and control of one Twinstream engine. Every endpoint but "
        "/healthz, /openapi.json and /docs needs `Authorization: Bearer <token>`.",
        openapi_url=DOCS_PATHS[0] if docs else None,
        docs_url=DOCS_PATHS[1] if docs else None,
        # Not served: ReDoc would be one more public page saying what /docs says, and the
        # OAuth2 redirect page serves an OAuth2 login this API does not have.
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.add_middleware(_TokenGate, token=token, public=public_paths(docs))
    bearer = HTTPBearer(auto_error=False)

    def authorized(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        # _TokenGate has refused a request without the token already; this dependency puts
        # the bearer scheme into the OpenAPI document (Swagger UI's Authorize button), and
        # checks again so that a route never depends on the gate alone.
        header = None if creds is None else f"{creds.scheme} {creds.credentials}"
        problem = token_problem(header, token)
        if problem is not None:
            raise HTTPException(401, problem)

    # Starlette's HTTPException, which FastAPI's subclasses: routing's own 404 and 405 and
    # FastAPI's 400 for an unreadable body raise the base class, and a handler of FastAPI's
    # alone would leave them answering {"detail": ...}.
    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 401:
            return _unauthorized(str(exc.detail))
        # The Allow header of a 405 stays.
        return JSONResponse(
            {"reason": exc.detail}, status_code=exc.status_code, headers=exc.headers
        )

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
        return JSONResponse({"reason": _one_line(exc)}, status_code=500)

    auth = [Depends(authorized)]

    @app.get(HEALTH_PATH)
    def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/server", dependencies=auth, responses=_errors(401))
    def server() -> ServerInfo:
        return engine.server()

    @app.get("/pipeline", dependencies=auth, responses=_errors(401))
    def pipeline() -> PipelineInfo:
        return engine.pipeline()

    @app.get("/timeline", dependencies=auth, responses=_errors(401))
    def timeline() -> TimelineInfo:
        """The last 15 minutes of this engine's end-to-end latency (p50/p99), inbound rate,
        lag and takeovers, in 5 s buckets (`twinstream.engine.timeline`)."""
        return engine.timeline()

    @app.post("/pipeline/stop", dependencies=auth, responses=_errors(401, 409))
    def stop() -> PipelineInfo:
        return engine.stop()

    @app.post("/pipeline/start", dependencies=auth, responses=_errors(401, 409))
    def start() -> PipelineInfo:
        return engine.start()

    @app.post("/pipeline/persist", dependencies=auth, responses=_errors(401, 409))
    def persist() -> Manifest:
        """Standby only (409 on the active): snapshot the checkpoint and the buffer."""
        return engine.persist()

    @app.post("/pipeline/restore", dependencies=auth, responses=_errors(400, 401, 409, 422))
    def restore(request: RestoreRequest) -> RestoreReport:
        """Stopped pipeline only (409 otherwise); 422 for a snapshot that must not be used."""
        return engine.restore(request.snapshot)

    @app.post("/pipeline/override", dependencies=auth, responses=_errors(401, 409))
    def override() -> PipelineInfo:
        """Let this engine lead although it disagrees with the active (409 when it does
        not disagree): an operator's decision, e.g. when it is the active that is wrong.
        A restore ends it."""
        return engine.override()

    @app.get("/pipeline/buffer", dependencies=auth, responses=_errors(401, 422))
    def buffer(last: int = Query(default=100, ge=1, le=1_000_000)) -> list[BufferedRow]:
        """The newest `last` output rows in the engine's ring buffer, in msg_id order."""
        return engine.buffer(last)

    @app.get(
        "/metrics", dependencies=auth, response_class=PlainTextResponse, responses=_errors(401)
    )
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.metrics(), media_type=CONTENT_TYPE)

    return app
