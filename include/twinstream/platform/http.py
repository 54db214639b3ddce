"""The bearer-token check every HTTP server of the platform makes: an engine's admin API
(twinstream.engine.api) and a publisher adapter's /metrics (twinstream.edge.publisher_metrics)
take the same `Authorization: Bearer <token>` and refuse it with the same reasons."""

from __future__ import annotations

import hmac


def token_problem(authorization: str | None, token: str) -> str | None:
    """Why an Authorization header does not carry the token, or None when it does."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return "missing bearer token (Authorization: Bearer <token>)"
    # Constant time, so that the answer's timing does not reveal how much of a guess is right.
    if not hmac.compare_digest(credentials.strip().encode(), token.encode()):
        return "wrong bearer token"
    return None
