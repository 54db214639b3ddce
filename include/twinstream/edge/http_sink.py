"""A subscriber adapter's HTTP sink: outputs POSTed downstream as JSON lines, each batch
with an idempotency key, so that a retry after a failure or a restart is one the receiver
can recognise; the position kept in a local file once the receiver acknowledged.

Guarantees:
- A batch is POSTed with `Idempotency-Key: <partition>:<first offset>-<last offset>,...`
  (the same records give the same key) and retried with a backoff (1 s doubling to 30 s,
  each wait said) until the receiver answers 2xx; a 4xx other than 408/429 stops the
  adapter with the receiver's answer (sending it again cannot help).
- The position (each partition's last offset acknowledged) is written, fsynced, only
  after the acknowledgement: a crash before it sends the batch again, with the same key;
  nothing is skipped.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from twinstream.edge.file_sink import Position, SinkError
from twinstream.edge.reader import Record

MAX_BACKOFF_S = 30.0


class HttpSink:
    """POSTs records to `url`; its position in `position_file`."""

    def __init__(
        self,
        url: str,
        position_file: Path,
        timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        echo: Callable[[str], None] = print,
        send: Callable[[urllib.request.Request, float], int] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise SinkError(f"{url}: an HTTP receiver's address starts with http:// or https://")
        self.path = Path(url)  # what the adapter names in its lines
        self.url = url
        self.position_file = position_file
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._echo = echo
        self._send = send or _send
        self.position = self._load()
        self._batch: list[Record] = []

    def _load(self) -> Position:
        try:
            data = json.loads(self.position_file.read_text())
            return Position({int(p): int(o) for p, o in data["offsets"].items()})
        except FileNotFoundError:
            return Position()
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SinkError(
                f"{self.position_file} is not a position file ({exc}): restore it, or delete it "
                "to deliver the topic again from its start (the receiver's keys repeat)"
            ) from None

    @property
    def unsynced(self) -> int:
        return len(self._batch)

    def write(self, record: Record) -> bool:
        last = self.position.offsets.get(record.partition)
        pending = [r.offset for r in self._batch if r.partition == record.partition]
        if (last is not None and record.offset <= last) or (
            pending and record.offset <= pending[-1]
        ):
            return False
        self._batch.append(record)
        return True

    def key(self) -> str:
        """The batch's idempotency key: each partition's offset range."""
        ranges: dict[int, tuple[int, int]] = {}
        for r in self._batch:
            first, _last = ranges.get(r.partition, (r.offset, r.offset))
            ranges[r.partition] = (first, r.offset)
        return ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(ranges.items()))

    def sync(self) -> None:
        """Deliver the batch (until acknowledged), then keep the position."""
        if not self._batch:
            return
        body = "".join(
            json.dumps(
                {
                    "partition": r.partition,
                    "offset": r.offset,
                    "msg_id": r.msg_id,
                    "key": r.key,
                    "value": None if r.tombstone else r.value,
                },
                separators=(",", ":"),
            )
            + "\n"
            for r in self._batch
        ).encode()
        # The scheme is http(s), checked when the sink was made.
        request = urllib.request.Request(self.url, data=body, method="POST")  # noqa: S310
        request.add_header("Content-Type", "application/x-ndjson")
        request.add_header("Idempotency-Key", self.key())
        backoff = 1.0
        while True:
            try:
                status = self._send(request, self.timeout_s)
            except (urllib.error.URLError, OSError) as exc:
                status, why = 0, str(exc)
            else:
                why = f"HTTP {status}"
            if 200 <= status < 300:
                break
            if 400 <= status < 500 and status not in (408, 429):
                raise SinkError(
                    f"{self.url} refused {len(self._batch)} records ({why}): fix the receiver "
                    "or its address; the adapter resumes from its position when started again"
                )
            self._echo(f"{self.url}: {why}; sending {self.key()} again in {backoff:.0f} s")
            self._sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        for r in self._batch:
            self.position.offsets[r.partition] = r.offset
        self._batch.clear()
        tmp = self.position_file.with_name(self.position_file.name + ".tmp")
        with open(tmp, "w") as out:
            json.dump({"offsets": self.position.offsets}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.position_file)

    def close(self) -> None:
        self.sync()


def _send(request: urllib.request.Request, timeout_s: float) -> int:
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
