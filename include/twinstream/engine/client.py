"""The one client of an engine's admin API (httpx, bearer token), typed by the API's own
pydantic models: the DAGs, the CLI, the stack's health checks and the tests use it.

Every failure becomes EngineError with the engine, the request and the engine's own
reason, so an Airflow task log says what went wrong without a stack trace to read.

An https engine's certificate is verified against the CA the client is given (`cafile`:
TWINSTREAM_ADMIN_TLS_CAFILE, or "ca" in an Airflow connection's extra), else against the
system's trusted CAs.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from twinstream.engine.api import (
    BufferedRow,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
    TimelineInfo,
)
from twinstream.engine.snapshot import Manifest
from twinstream.platform.settings import Connections

if TYPE_CHECKING:
    pass

# What to do when an engine's certificate does not verify: the one fix there is.
_GIVE_THE_CA = (
    "give the client the CA that signed the engine's certificate: "
    'TWINSTREAM_ADMIN_TLS_CAFILE, or {"ca": "<path>"} in the Airflow connection\'s extra'
)


class EngineError(Exception):
    def __init__(self, engine_id: str, request: str, status: int | None, reason: str) -> None:
        self.engine_id = engine_id
        self.status = status
        self.reason = reason
        code = f"HTTP {status}" if status is not None else "unreachable"
        super().__init__(f"engine {engine_id}: {request}: {code}: {reason}")


def tls_context(engine_id: str, cafile: str) -> ssl.SSLContext:
    """Verifies a server's certificate against `cafile` (httpx 0.28 deprecates a path as
    `verify`). An unreadable CA is EngineError naming the file, at once."""
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise EngineError(
            engine_id,
            "TLS setup",
            None,
            f"CA file {cafile} does not load ({exc}): give the path of the PEM certificate "
            "of the CA that signed the engine's certificate",
        ) from None


class EngineClient:
    def __init__(
        self,
        engine_id: str,
        base_url: str,
        token: str,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        cafile: str | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
            verify=tls_context(engine_id, cafile) if cafile else True,
        )

    @classmethod
    def from_settings(
        cls, settings: Connections, engine_id: str, token: str, timeout_s: float = 10.0
    ) -> EngineClient:
        """The engine's client as `settings` describe it: its URL (https when the admin API
        has TLS) and the CA its certificate is verified with."""
        return cls(
            engine_id,
            settings.engine_admin_url(engine_id),
            token,
            timeout_s,
            cafile=settings.admin_tls_cafile or None,
        )

    @classmethod
    def from_connection(
        cls,
        engine_id: str,
        host: str,
        port: int | None,
        schema: str | None,
        password: str,
        extra: Mapping[str, Any] | str | None = None,
    ) -> EngineClient:
        """From an Airflow HTTP connection: host, port, schema (http/https), token as the
        password (AIRFLOW_CONN_TWINSTREAM_ENGINE_<ID>), and for https with a private CA its
        PEM file's path as "ca" in the extra (a dict, or the extra's JSON text)."""
        if not host:
            raise ValueError(f"engine {engine_id}: the connection has no host")
        if not password:
            raise ValueError(f"engine {engine_id}: the connection has no token (password)")
        scheme = schema or "http"
        address = host if "://" in host else f"{scheme}://{host}"
        options = _connection_extra(engine_id, extra)
        cafile = options.get("ca")
        if cafile is not None and not isinstance(cafile, str):
            raise ValueError(
                f'engine {engine_id}: the connection\'s extra "ca" is {cafile!r}; give the '
                "path of the CA's PEM file as a string"
            )
        url = f"{address}:{port}" if port else address
        return cls(engine_id, url, password, cafile=cafile or None)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _unreachable(self, request: str, exc: httpx.HTTPError) -> EngineError:
        reason = f"{self.base_url}: {exc or type(exc).__name__}"
        if _untrusted_certificate(exc):
            # The fix first: a health check's detail keeps only the reason's start.
            reason = f"{self.base_url}: the engine's TLS certificate does not verify; "
            reason += f"{_GIVE_THE_CA} ({exc})"
        return EngineError(self.engine_id, request, None, reason)

    def _call(self, method: str, path: str, timeout_s: float | None = None, **kwargs: Any) -> Any:
        request = f"{method} {path}"
        try:
            extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
            response = self._client.request(method, path, **kwargs, **extra)
        except httpx.HTTPError as exc:
            raise self._unreachable(request, exc) from exc
        if response.status_code >= 400:
            try:
                reason = str(response.json().get("reason", response.text))
            except ValueError:
                reason = response.text[:500]
            raise EngineError(self.engine_id, request, response.status_code, reason)
        return response.json()

    def healthy(self) -> bool:
        try:
            self._call("GET", "/healthz", timeout_s=3.0)
        except EngineError:
            return False
        return True

    def server(self) -> ServerInfo:
        return ServerInfo.model_validate(self._call("GET", "/server"))

    def pipeline(self) -> PipelineInfo:
        return PipelineInfo.model_validate(self._call("GET", "/pipeline"))

    def timeline(self) -> TimelineInfo:
        """The engine's last 15 minutes of figures (GET /timeline)."""
        return TimelineInfo.model_validate(self._call("GET", "/timeline"))

    def stop(self) -> PipelineInfo:
        return PipelineInfo.model_validate(self._call("POST", "/pipeline/stop", timeout_s=120.0))

    def start(self) -> PipelineInfo:
        # Starts the query and joins the election; Spark's start takes seconds.
        return PipelineInfo.model_validate(self._call("POST", "/pipeline/start", timeout_s=120.0))

    def persist(self) -> Manifest:
        # Stops the standby's query, copies, restarts it: seconds, longer on a large state.
        return Manifest.model_validate(self._call("POST", "/pipeline/persist", timeout_s=600.0))

    def restore(self, snapshot: str) -> RestoreReport:
        result = self._call(
            "POST", "/pipeline/restore", json={"snapshot": snapshot}, timeout_s=600.0
        )
        return RestoreReport.model_validate(result)

    def override(self) -> PipelineInfo:
        return PipelineInfo.model_validate(self._call("POST", "/pipeline/override"))

    def buffer(self, last: int) -> list[BufferedRow]:
        rows = self._call("GET", "/pipeline/buffer", params={"last": last})
        return [BufferedRow.model_validate(row) for row in rows]

    def metrics(self) -> str:
        try:
            response = self._client.get("/metrics")
        except httpx.HTTPError as exc:
            raise self._unreachable("GET /metrics", exc) from exc
        if response.status_code >= 400:
            raise EngineError(self.engine_id, "GET /metrics", response.status_code, response.text)
        return response.text

    def response(
        self, method: str, path: str, timeout_s: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        """The raw response, refusals included: for callers (tests, tools) that look at
        the status code of a request the API refuses."""
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        return self._client.request(method, path, **kwargs, **extra)


def _connection_extra(engine_id: str, extra: Mapping[str, Any] | str | None) -> Mapping[str, Any]:
    """An Airflow connection's extra: Connection.extra is JSON text, extra_dejson a dict."""
    if extra is None or isinstance(extra, Mapping):
        return extra or {}
    if not extra.strip():
        return {}
    try:
        options = json.loads(extra)
    except ValueError as exc:
        raise ValueError(
            f"engine {engine_id}: the connection's extra is not JSON ({exc}); write it as an "
            'object, {"ca": "<path>"}'
        ) from None
    if not isinstance(options, dict):
        raise ValueError(
            f'engine {engine_id}: the connection\'s extra is not a JSON object: {{"ca": "<path>"}}'
        )
    return options


def _untrusted_certificate(exc: BaseException) -> bool:
    """The request failed because the server's certificate did not verify (httpx wraps
    ssl's error in its own ConnectError, possibly more than one level down)."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    # A chain may loop back on itself; each exception is looked at once.
    while seen is not None and all(seen is not other for other in chain):
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) or (
        "CERTIFICATE_VERIFY_FAILED" in str(exc)
    )
