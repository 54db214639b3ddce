"""An HTTP source for the publisher adapter: clients POST JSON lines, and are answered only
once their lines are committed to the inbound topic, so that a client that timed out may
send the same request again: it is idempotent by the client's key.

Guarantees:
- `POST /records` with an `Idempotency-Key` header ([A-Za-z0-9_-], 1-64) and a body of JSON
  lines answers 200 once every line of it is committed, in one transaction or in order
  across several; the same key again answers 200 ("committed earlier") and publishes
  nothing, also after a takeover: each record carries `http:<key>@0.0:<line>` as its source
  position, and a new active reads the keys of the inbound topic's recent records
  (`recent`) before it serves.
- A request to an adapter that is not the active one, or whose lead ends before its lines
  are committed, is answered 503 with the reason: nothing of it was committed, and the
  client sends it again (to the active adapter).
- A body that is not lines of UTF-8 text, a line over `max_line_bytes`, or a missing key is
  answered 400 with the reason, and nothing of it is published.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from twinstream.edge.sources import Line, Position

log = logging.getLogger(__name__)

KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PREFIX = "http:"
# How long a request waits for its commit before it is answered 503 (the client retries).
COMMIT_WAIT_S = 30.0


def position(key: str, index: int) -> Position:
    return Position(f"{PREFIX}{key}", 0, "0", index)


def key_of(source_text: str) -> str | None:
    """The client key of a record's source position, if an HTTP request was its source."""
    if not source_text.startswith(PREFIX):
        return None
    return source_text[len(PREFIX) :].split("@", 1)[0]


@dataclass
class _Request:
    key: str
    lines: list[bytes]
    done: threading.Event = field(default_factory=threading.Event)
    committed: int = 0
    failed: str | None = None


class HttpSource:
    """Serves POST /records; `lines` gives the queued requests' lines while leading."""

    def __init__(
        self,
        host: str,
        port: int,
        recent: Callable[[], Iterable[str]] = lambda: (),
        max_line_bytes: int = 1_000_000,
        poll_s: float = 0.1,
    ) -> None:
        self.recent = recent
        self.max_line_bytes = max_line_bytes
        self.poll_s = poll_s
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._pending: dict[str, _Request] = {}
        self._done: dict[str, int] = {}
        self._lock = threading.Lock()
        self._serving = threading.Event()  # this adapter leads and takes requests
        self._inflight: list[_Request] = []
        # The adapter's idle hook (commit what is pending, then wait): set by the adapter's
        # source factory; plain waiting until then.
        self.idle: Callable[[float], None] = time.sleep
        source = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                status, body = source.handle(
                    self.path,
                    self.headers.get("Idempotency-Key"),
                    self.rfile.read(int(self.headers.get("Content-Length") or 0)),
                )
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up waiting: its retry with the same key is answered.
                    log.info("http source: a client left before its answer (%s)", status)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http source: %s", format % args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- requests -------------------------------------------------------------------------

    def handle(self, path: str, key: str | None, body: bytes) -> tuple[int, dict[str, object]]:
        if path.rstrip("/") != "/records":
            return 404, {"reason": f"no {path}: POST JSON lines to /records"}
        if key is None or not KEY.match(key):
            return 400, {
                "reason": "an Idempotency-Key header of 1-64 letters, digits, _ or - "
                "is required: the same key again is answered, never published twice"
            }
        try:
            lines = [line.encode() for line in body.decode("utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError as exc:
            return 400, {"reason": f"the body is not UTF-8 text ({exc}): send JSON lines"}
        too_long = [i for i, line in enumerate(lines) if len(line) > self.max_line_bytes]
        if too_long:
            return 400, {"reason": f"line {too_long[0]} is over {self.max_line_bytes} bytes"}
        with self._lock:
            if key in self._done:
                return 200, {"key": key, "records": self._done[key], "committed": "earlier"}
            if not self._serving.is_set():
                return 503, {
                    "reason": "this publisher adapter is not the active one: send the "
                    "request again to the active adapter (or here, later)"
                }
            request = self._pending.get(key)
            if request is None:
                request = self._pending[key] = _Request(key, lines)
                self._queue.put(request)
        if not request.done.wait(COMMIT_WAIT_S) or request.failed is not None:
            return 503, {"reason": request.failed or "not committed in time; send it again"}
        return 200, {"key": key, "records": request.committed, "committed": "now"}

    # -- the adapter's side ---------------------------------------------------------------

    def lines(self, after: Position | None, stop: threading.Event) -> Iterator[Line]:
        """The lines of the requests queued while this adapter leads, until `stop`."""
        keys = {k for text in self.recent() if (k := key_of(text)) is not None}
        with self._lock:
            for key in keys:
                self._done.setdefault(key, -1)  # committed by an earlier active
        self._serving.set()
        try:
            while not stop.is_set():
                try:
                    request = self._queue.get_nowait()
                except queue.Empty:
                    # Nothing more for now: the adapter commits what is pending, then waits.
                    self.idle(self.poll_s)
                    continue
                self._inflight.append(request)
                for index, raw in enumerate(request.lines):
                    yield Line(raw, position(request.key, index))
                if not request.lines:
                    self.committed([])
        finally:
            self._serving.clear()
            self._fail_all("the adapter stopped leading before these lines were committed")

    def lag(self, after: Position | None) -> int | None:
        """Not knowable: the source's end is whatever clients send next."""
        return None

    def committed(self, lines: Sequence[Line]) -> None:
        """Lines committed (in order): answer every request whose lines all are."""
        last = {line.position.file[len(PREFIX) :]: line.position.offset for line in lines}
        with self._lock:
            while self._inflight:
                request = self._inflight[0]
                end = last.get(request.key)
                whole = not request.lines or (end is not None and end == len(request.lines) - 1)
                if not whole:
                    break
                self._inflight.pop(0)
                request.committed = len(request.lines)
                self._done[request.key] = request.committed
                self._pending.pop(request.key, None)
                request.done.set()

    def _fail_all(self, why: str) -> None:
        with self._lock:
            waiting = list(self._inflight)
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            self._inflight.clear()
            for request in waiting:
                request.failed = why
                self._pending.pop(request.key, None)
                request.done.set()
