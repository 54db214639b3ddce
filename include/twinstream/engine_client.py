"""The one client of an engine's admin API (httpx, bearer token), typed by the API's own
pydantic models: the DAGs, the CLI, the stack's health checks and the tests use it.

Every failure becomes EngineError with the engine, the request and the engine's own
reason, so an Airflow task log says what went wrong without a stack trace to read.
"""

from __future__ import annotations

from typing import Any

import httpx

from twinstream.admin_api import (
    BufferedRow,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
)
from twinstream.snapshot import Manifest


class EngineError(Exception):
    def __init__(self, engine_id: str, request: str, status: int | None, reason: str) -> None:
        self.engine_id = engine_id
        self.status = status
        self.reason = reason
        code = f"HTTP {status}" if status is not None else "unreachable"
        super().__init__(f"engine {engine_id}: {request}: {code}: {reason}")


class EngineClient:
    def __init__(
        self,
        engine_id: str,
        base_url: str,
        token: str,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
        )

    @classmethod
    def from_connection(
        cls, engine_id: str, host: str, port: int | None, schema: str | None, password: str
    ) -> EngineClient:
        """From an Airflow HTTP connection: host, port, schema (http/https), token as the
        password (AIRFLOW_CONN_TWINSTREAM_ENGINE_<ID>)."""
        if not host:
            raise ValueError(f"engine {engine_id}: the connection has no host")
        if not password:
            raise ValueError(f"engine {engine_id}: the connection has no token (password)")
        scheme = schema or "http"
        address = host if "://" in host else f"{scheme}://{host}"
        return cls(engine_id, f"{address}:{port}" if port else address, password)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, timeout_s: float | None = None, **kwargs: Any) -> Any:
        request = f"{method} {path}"
        try:
            extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
            response = self._client.request(method, path, **kwargs, **extra)
        except httpx.HTTPError as exc:
            raise EngineError(
                self.engine_id, request, None, f"{self.base_url}: {exc or type(exc).__name__}"
            ) from exc
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

    def buffer(self, last: int) -> list[BufferedRow]:
        rows = self._call("GET", "/pipeline/buffer", params={"last": last})
        return [BufferedRow.model_validate(row) for row in rows]

    def metrics(self) -> str:
        try:
            response = self._client.get("/metrics")
        except httpx.HTTPError as exc:
            raise EngineError(self.engine_id, "GET /metrics", None, str(exc)) from exc
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
