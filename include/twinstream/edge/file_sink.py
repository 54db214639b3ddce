"""A subscriber adapter's file: every output record of a pipeline exactly once, its position
kept with what it wrote.

Guarantees:
- Each line is one record of the outbound topic with its partition and offset, in offset
  order within each partition (`write` refuses a record behind the file's position for its
  partition rather than write it twice).
- The position is the file's own content: at open, a line a crash left half written is
  cut, and each partition's last offset is read back from the lines (from a sidecar
  checkpoint `<file>.position` on, so that a long file is not read again from its start);
  the adapter resumes right after it. A restart, whenever it comes, neither skips nor
  repeats a record.
- What `sync` returns from is on disk (fsync) and in the sidecar; a crash loses at most
  what was written since, and the next open reads it again from Kafka.

JSON lines: {"partition", "offset", "msg_id", "key", "value"} (value as the pipeline wrote
it, parsed when it is JSON). CSV: partition,offset,msg_id,key,value, one line a record
(the value is the record's JSON text; a key's line breaks are written as \\n).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from twinstream.edge.reader import Record

Format = Literal["jsonl", "csv"]
CSV_HEADER = ("partition", "offset", "msg_id", "key", "value")


class SinkError(RuntimeError):
    """The file cannot be continued as it is; the message says why and what to do."""


def format_of(path: Path) -> Format:
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix == ".csv":
        return "csv"
    raise SinkError(f"{path}: the file's name must end in .jsonl or .csv (its format)")


@dataclass
class Position:
    """The last offset written of each partition, and the file's length that holds them."""

    offsets: dict[int, int] = field(default_factory=dict)
    length: int = 0

    def next_offsets(self) -> dict[int, int]:
        """Where to read on: right after each partition's last offset written."""
        return {p: o + 1 for p, o in self.offsets.items()}


class FileSink:
    """One adapter's output file, opened for appending at its recovered position."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.format = format_of(path)
        self.sidecar = path.with_name(path.name + ".position")
        self.position = self._recover()
        self._out: IO[str] = open(path, "a", encoding="utf-8", newline="")  # noqa: SIM115
        if self.position.length == 0 and self.format == "csv":
            self._out.write(_csv_line(CSV_HEADER))
        self._unsynced = 0

    # -- recovery -----------------------------------------------------------------------

    def _recover(self) -> Position:
        if not self.path.exists():
            self.sidecar.unlink(missing_ok=True)
            return Position()
        saved = self._read_sidecar()
        with open(self.path, "rb+") as raw:
            size = raw.seek(0, os.SEEK_END)
            if saved.length > size:
                raise SinkError(
                    f"{self.path} is {size} bytes, shorter than the {saved.length} its "
                    f"position ({self.sidecar}) says were written: someone cut it. Move both "
                    "files away to start a new file from the topic's start, or restore the file"
                )
            raw.seek(saved.length)
            tail = raw.read()
            complete = tail.rfind(b"\n") + 1
            if complete < len(tail):
                # A line cut by a crash: it is read again from Kafka.
                raw.truncate(saved.length + complete)
        position = Position(dict(saved.offsets), saved.length + complete)
        for line in tail[:complete].decode("utf-8").splitlines():
            parsed = self._parse(line)
            if parsed is not None:
                partition, offset = parsed
                position.offsets[partition] = offset
        return position

    def _read_sidecar(self) -> Position:
        try:
            data = json.loads(self.sidecar.read_text())
            return Position({int(p): int(o) for p, o in data["offsets"].items()}, data["length"])
        except FileNotFoundError:
            return Position()
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SinkError(
                f"{self.sidecar} is not a position file ({exc}): delete it, and the position "
                f"is read back from {self.path} alone (from its start)"
            ) from None

    def _parse(self, line: str) -> tuple[int, int] | None:
        """(partition, offset) of a line; None for the CSV header."""
        try:
            if self.format == "jsonl":
                data = json.loads(line)
                return int(data["partition"]), int(data["offset"])
            row = next(csv.reader([line]))
            if tuple(row) == CSV_HEADER:
                return None
            return int(row[0]), int(row[1])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SinkError(
                f"{self.path}: a line is not one this adapter wrote ({exc}): {line[:200]!r}. "
                "Give the adapter a file of its own"
            ) from None

    # -- writing ------------------------------------------------------------------------

    def write(self, record: Record) -> bool:
        """Append `record`; False (nothing written) when the file holds it already."""
        last = self.position.offsets.get(record.partition)
        if last is not None and record.offset <= last:
            return False
        self._out.write(self._line(record))
        self.position.offsets[record.partition] = record.offset
        self._unsynced += 1
        return True

    def _line(self, record: Record) -> str:
        if self.format == "jsonl":
            value: Any = None if record.tombstone else _json_or_text(record.value)
            data = {
                "partition": record.partition,
                "offset": record.offset,
                "msg_id": record.msg_id,
                "key": record.key,
                "value": value,
            }
            return json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"
        key = "" if record.key is None else record.key.replace("\r", "\\r").replace("\n", "\\n")
        value_text = "" if record.tombstone else record.value.replace("\n", "\\n")
        msg_id = "" if record.msg_id is None else str(record.msg_id)
        return _csv_line((str(record.partition), str(record.offset), msg_id, key, value_text))

    @property
    def unsynced(self) -> int:
        return self._unsynced

    def sync(self) -> None:
        """Put what was written on disk, then the position that says so."""
        self._out.flush()
        os.fsync(self._out.fileno())
        self.position.length = self._out.tell()
        tmp = self.sidecar.with_name(self.sidecar.name + ".tmp")
        tmp.write_text(
            json.dumps({"length": self.position.length, "offsets": self.position.offsets})
        )
        os.replace(tmp, self.sidecar)
        self._unsynced = 0

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._out.close()


def _csv_line(fields: tuple[str, ...]) -> str:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerow(fields)
    return text.getvalue()


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
