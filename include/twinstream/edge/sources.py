"""What a publisher adapter reads: the lines of a file, or of a folder's files, followed as
they grow, each with the position right after it, so that a new active adapter resumes
after the last line the old one published.

Guarantees:
- Lines come in file order, each once, with `Position(file, inode, head, offset)`: the
  file's name, which file it was (its inode, a name being reused by rotation, and a digest
  of its first bytes, an inode being reused by a new file as Filebeat's fingerprint
  identity assumes), and the byte offset right after the line. `lines(after=p)` starts
  right after `p`.
- A line is given only once it is complete (ends in a newline): a writer's half-written
  line waits for its end.
- Followed as `tail -F` follows a file: when the name comes to mean another file (renamed
  away and created again, the usual rotation) or the file is cut shorter (copytruncate),
  the old file is read to its end first, then the new one from its start. A position in a
  rotated file is found again by its inode in the same folder; if that file is gone, the
  lines after the position are reported lost (`Lost`), never passed over in silence.
- A folder's files are read in name order; the last one is followed as it grows, and a
  file is left only once a later one exists and it has nothing more.
- With `header=True` (CSV), each file's first line is its header: given with every line of
  that file (after a resume in the middle too), never as a line.

`StreamSource` reads a stream that cannot be read twice (standard input) instead: its
positions are the line number and byte offset in this process's stream
(`stdin@0.L<line>:<offset>`), and a resume skips the lines up to a position's offset, so
every adapter of a group must be fed the same bytes (see its docstring).

Every source says how far its end is beyond a position (`lag`, bytes; None where that
cannot be known), for the adapter's status.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

# Lines longer than this are not read whole: reported with their position (`TooLong`) and
# skipped to their end, so that one runaway line cannot exhaust the adapter's memory.
MAX_LINE_BYTES = 1_000_000
# How much of a file's start identifies it (with its inode).
HEAD_BYTES = 256
# A StreamSource's name in its positions.
STDIN = "stdin"
# How much of its stream a StreamSource keeps that no commit of its own has passed: a
# standby reads its standard input all along (a writer feeding every adapter through `tee`
# would otherwise block on the standby's full pipe) and keeps this much of it for a takeover.
SPOOL_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Position:
    """Right after a line: the file's name, its inode and head digest, the byte offset."""

    file: str
    inode: int
    head: str
    offset: int

    def text(self) -> str:
        return f"{self.file}@{self.inode}.{self.head}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Position:
        try:
            where, offset = text.rsplit(":", 1)
            name, identity = where.rsplit("@", 1)
            inode, head = identity.split(".", 1)
            return cls(name, int(inode), head, int(offset))
        except ValueError:
            raise ValueError(
                f"{text!r} is not a source position (FILE@INODE.HEAD:OFFSET)"
            ) from None


def head_of(fd: int, offset: int) -> str:
    """The digest of a file's first min(offset, HEAD_BYTES) bytes."""
    return hashlib.sha1(
        os.pread(fd, min(offset, HEAD_BYTES), 0), usedforsecurity=False
    ).hexdigest()[:12]


@dataclass(frozen=True)
class Line:
    raw: bytes  # without its line break
    position: Position  # right after it
    # With `header=True`: the first line of the line's file (a CSV header), never given as
    # a line itself.
    header: bytes | None = None


@dataclass(frozen=True)
class TooLong:
    """A line over MAX_LINE_BYTES, skipped; `position` is right after it."""

    length: int
    position: Position


@dataclass(frozen=True)
class Lost:
    """Lines that can no longer be read: the file a position names is gone."""

    after: Position
    why: str


Event = Line | TooLong | Lost


class FileSource:
    """The lines of `path`: one file, or every file of a folder matching `pattern`."""

    def __init__(
        self,
        path: Path,
        pattern: str = "*",
        poll_s: float = 0.2,
        max_line_bytes: int = MAX_LINE_BYTES,
        sleep: Callable[[float], None] = time.sleep,
        header: bool = False,
    ) -> None:
        self.path = path
        self.header = header
        self.pattern = pattern
        self.poll_s = poll_s
        self.max_line_bytes = max_line_bytes
        self.sleep = sleep

    # -- which files ----------------------------------------------------------------------

    def _folder(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    def _names(self) -> list[str]:
        """The files to read, in order: the folder's (by name), or the one file."""
        if self.path.is_dir():
            return sorted(
                p.name
                for p in self.path.glob(self.pattern)
                if p.is_file() and not p.name.startswith(".")
            )
        return [self.path.name] if self.path.exists() else []

    def _find(self, position: Position) -> Path | None:
        """The file `position` was in, whatever its name now: its inode, and its first
        bytes the same (a new file may get a deleted one's inode)."""
        for candidate in self._folder().iterdir():
            try:
                if not candidate.is_file() or candidate.stat().st_ino != position.inode:
                    continue
                fd = os.open(candidate, os.O_RDONLY)
                try:
                    if head_of(fd, position.offset) == position.head:
                        return candidate
                finally:
                    os.close(fd)
            except FileNotFoundError:
                continue
        return None

    # -- how far behind -------------------------------------------------------------------

    def lag(self, after: Position | None) -> int | None:
        """Bytes of the source beyond `after` (None: its start): the rest of `after`'s file
        and, in a folder, every later file's; after a rotation, the old file's rest and the
        new one's length. None when a file cannot be read just now."""
        try:
            folder = self._folder()
            names = self._names()
            if after is None:
                return sum((folder / n).stat().st_size for n in names)
            try:
                now: os.stat_result | None = (folder / after.file).stat()
            except FileNotFoundError:
                now = None
            if now is not None and now.st_ino == after.inode:
                # Cut shorter (copytruncate): the source reads it again from its start.
                rest = now.st_size - after.offset if now.st_size >= after.offset else now.st_size
            else:
                old = self._find(after)
                rest = max(0, old.stat().st_size - after.offset) if old is not None else 0
                if now is not None and not self.path.is_dir():
                    rest += now.st_size  # the file now under the name, read next
            if self.path.is_dir():
                rest += sum((folder / n).stat().st_size for n in names if n > after.file)
            return rest
        except OSError:
            return None

    # -- reading --------------------------------------------------------------------------

    def lines(self, after: Position | None, stop: threading.Event) -> Iterator[Event]:
        """Every line after `after` (None: from the first file's start), followed until
        `stop` is set."""
        handle: IO[bytes] | None = None
        name = ""
        if after is not None:
            found = self._find(after)
            if found is not None:
                handle = open(found, "rb")  # noqa: SIM115
                handle.seek(after.offset)
                name = after.file
            else:
                yield Lost(
                    after,
                    f"no file of inode {after.inode} in {self._folder()} "
                    f"any more (it was {after.file}): rotated away and deleted",
                )
                name = after.file
        try:
            while not stop.is_set():
                if handle is None:
                    handle, name = self._next_file(name, stop)
                    if handle is None:
                        return
                yield from self._read_available(handle, name)
                if self._moved_on(handle, name):
                    # Rotated, truncated, or a later file exists: this one is done once its
                    # last complete line is read (just above).
                    handle.close()
                    handle = None
                    continue
                self.sleep(self.poll_s)
        finally:
            if handle is not None:
                handle.close()

    def _next_file(self, current: str, stop: threading.Event) -> tuple[IO[bytes] | None, str]:
        """The file after `current` ("" for the first): by name in a folder; the same name
        again for one file (its new generation after a rotation). Waits for it to exist."""
        while not stop.is_set():
            names = self._names()
            if self.path.is_dir():
                later = [n for n in names if n > current]
                if later:
                    return open(self._folder() / later[0], "rb"), later[0]
            elif names:
                return open(self.path, "rb"), self.path.name
            self.sleep(self.poll_s)
        return None, current

    def _moved_on(self, handle: IO[bytes], name: str) -> bool:
        """Whether nothing more will come from `handle`: its name now means another file
        (or was cut shorter), or, in a folder, a later file exists."""
        here = os.fstat(handle.fileno())
        if self.path.is_dir():
            return any(n > name for n in self._names()) and here.st_size <= handle.tell()
        try:
            now = (self._folder() / name).stat()
        except FileNotFoundError:
            return False  # renamed away, not created again yet: keep reading the old one
        return now.st_ino != here.st_ino or now.st_size < handle.tell()

    def _read_available(self, handle: IO[bytes], name: str) -> Iterator[Event]:
        fd = handle.fileno()
        inode = os.fstat(fd).st_ino
        full_head: str | None = None

        def at(offset: int) -> Position:
            nonlocal full_head
            if offset >= HEAD_BYTES:
                full_head = full_head or head_of(fd, offset)
                return Position(name, inode, full_head, offset)
            return Position(name, inode, head_of(fd, offset), offset)

        header: bytes | None = None
        if self.header:
            first = os.pread(fd, self.max_line_bytes + 1, 0).split(b"\n", 1)
            if len(first) < 2:
                return  # the header is not written whole yet
            header = first[0].rstrip(b"\r")
            if handle.tell() == 0:
                handle.seek(len(first[0]) + 1)
        while True:
            start = handle.tell()
            raw = handle.readline(self.max_line_bytes + 1)
            if not raw:
                return
            if not raw.endswith(b"\n"):
                if len(raw) <= self.max_line_bytes:
                    handle.seek(start)  # half written: wait for its end
                    return
                # Too long: skip to its end (it may not be written whole yet).
                length = len(raw)
                while not raw.endswith(b"\n"):
                    raw = handle.readline(self.max_line_bytes)
                    if not raw:
                        handle.seek(start)
                        return
                    length += len(raw)
                yield TooLong(length - 1, at(handle.tell()))
                continue
            yield Line(raw.rstrip(b"\r\n"), at(handle.tell()), header)


def stream_position(line: int, offset: int, name: str = STDIN) -> Position:
    """Right after line `line` (from 1) of a stream, `offset` bytes into it:
    `stdin@0.L12:345`. A stream has no inode nor head: it is this process's own."""
    return Position(name, 0, f"L{line}", offset)


class StreamSource:
    """The lines of a stream that can be read only once (standard input), for a publisher
    adapter of a group whose every adapter is fed the same bytes.

    Guarantees:
    - It reads the stream from its start, on a thread of its own, from `start()` on, whether
      its adapter leads or not: a standby keeps what it read (up to `spool_bytes`, the
      oldest dropped first) for a takeover, and never blocks its writer; an active one
      keeps every line until a commit passes it, and while it holds `spool_bytes` it reads
      no more (its writer waits: backpressure, never a loss).
    - Positions are this process's own: line number and byte offset (`stream_position`).
      `lines(after=p)` gives the lines that end beyond `p`'s byte offset, each once, in
      order: a new active skips what the last one published, which is right only if its
      stream holds the same bytes (a position that falls inside one of its lines says it
      does not, in the log). A position of another source (a file, HTTP) skips nothing.
    - Nothing is dropped in silence: a line over `max_line_bytes` is a `TooLong` with its
      position; lines a standby dropped from a full spool that a takeover would have needed
      are a `Lost` with their byte range; a final line without a line break is a line.
    - At the stream's end `lines` returns once every line was given (`ended` is then true),
      so that the adapter can finish; a read error ends the stream too, logged.
    - With `header=True` (CSV) the stream's first line is its header, given with every line
      (after a resume too), never as a line.
    """

    def __init__(
        self,
        stream: IO[bytes],
        name: str = STDIN,
        header: bool = False,
        max_line_bytes: int = MAX_LINE_BYTES,
        spool_bytes: int = SPOOL_BYTES,
        poll_s: float = 0.2,
    ) -> None:
        self.name = name
        self.header = header
        self.max_line_bytes = max_line_bytes
        self.spool_bytes = spool_bytes
        self.poll_s = poll_s
        self._stream = stream
        self._cond = threading.Condition()
        # What was read and not yet passed by a commit: (event, its bytes in the stream).
        self._spool: deque[tuple[Line | TooLong, int]] = deque()
        self._spooled = 0
        # How many events left the spool's head so far: an event's index is stable.
        self._base = 0
        # Right after the last line a standby dropped from its full spool.
        self._dropped: Position | None = None
        self._header: bytes | None = None
        self._read_bytes = 0
        self._read_lines = 0
        self._leading = False
        self.ended = False
        # The adapter's idle hook (commit what is pending, then wait): set by the adapter's
        # source factory; plain waiting until then.
        self.idle: Callable[[float], None] = time.sleep
        self._thread = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def read_bytes(self) -> int:
        """Bytes of the stream read so far."""
        return self._read_bytes

    # -- the reading thread ---------------------------------------------------------------

    def _read(self) -> None:
        try:
            while True:
                raw = self._stream.readline(self.max_line_bytes + 1)
                if not raw:
                    return
                length = len(raw)
                too_long = len(raw) > self.max_line_bytes and not raw.endswith(b"\n")
                while too_long and raw and not raw.endswith(b"\n"):
                    # Read on to its end, never holding more than a limit's worth of it.
                    raw = self._stream.readline(self.max_line_bytes + 1)
                    length += len(raw)
                self._read_bytes += length
                self._read_lines += 1
                at = stream_position(self._read_lines, self._read_bytes, self.name)
                if too_long:
                    self._keep(TooLong(length - raw.endswith(b"\n"), at), length)
                    continue
                text = raw.rstrip(b"\r\n")
                if self.header and self._read_lines == 1:
                    self._header = text
                    continue
                self._keep(Line(text, at, self._header), length)
        except (OSError, ValueError) as exc:
            # A closed or broken stream: it ends here, and says why.
            log.error(
                "%s: reading failed after line %s (byte %s): %s",
                self.name,
                self._read_lines,
                self._read_bytes,
                exc,
            )
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()
            log.warning(
                "%s ended after %s lines (%s bytes): nothing more will come from it",
                self.name,
                self._read_lines,
                self._read_bytes,
            )

    def _keep(self, event: Line | TooLong, size: int) -> None:
        with self._cond:
            # Leading: wait for a commit to make room (the writer waits with us).
            while self._leading and self._spool and self._spooled + size > self.spool_bytes:
                self._cond.wait(0.5)
            self._spool.append((event, size))
            self._spooled += size
            # Standby: the oldest lines go first; a takeover that needs them says so.
            while not self._leading and len(self._spool) > 1 and self._spooled > self.spool_bytes:
                old, old_size = self._spool.popleft()
                self._base += 1
                self._spooled -= old_size
                self._dropped = old.position
            self._cond.notify_all()

    # -- the adapter's side ---------------------------------------------------------------

    def lines(self, after: Position | None, stop: threading.Event) -> Iterator[Event]:
        """The lines that end beyond `after`'s byte offset, as the stream gives them,
        until `stop` or the stream's end."""
        mine = after is not None and after.file == self.name
        skip_to = after.offset if after is not None and mine else 0
        if after is not None and not mine:
            log.warning(
                "%s: the last line published came from another source (%s): reading %s "
                "from its start",
                self.name,
                after.text(),
                self.name,
            )
        with self._cond:
            self._leading = True
            index = self._base
            dropped = self._dropped
        try:
            if dropped is not None and dropped.offset > skip_to:
                yield Lost(
                    after or stream_position(0, 0, self.name),
                    f"bytes {skip_to}-{dropped.offset} of {self.name} (to its line "
                    f"{dropped.head[1:]}) were read while this adapter was "
                    f"standby and dropped from its spool of {self.spool_bytes} bytes before "
                    "it took over: publish them again from where they came from",
                )
            while not stop.is_set():
                with self._cond:
                    index = max(index, self._base)
                    held = index - self._base < len(self._spool)
                    event, size = self._spool[index - self._base] if held else (None, 0)
                    ended = self.ended
                if event is not None:
                    index += 1
                    end = event.position.offset
                    if end < skip_to:
                        continue
                    if end == skip_to:
                        if after is not None and event.position.head != after.head:
                            log.warning(
                                "%s: the last line published was line %s, which ends at "
                                "byte %s as this adapter's line %s does: were the adapters "
                                "fed the same stream?",
                                self.name,
                                after.head[1:],
                                skip_to,
                                event.position.head[1:],
                            )
                        continue
                    if mine and end - size < skip_to:
                        # Never in one stream: the adapters were fed different ones.
                        yield Lost(
                            event.position,
                            f"the last line published ends at byte {skip_to}, inside this "
                            f"adapter's line {event.position.head[1:]}: its {self.name} is not "
                            "the stream the last active was fed (each adapter must be fed the "
                            "same bytes); that line is skipped, and lines may be missing or "
                            "repeated around it",
                        )
                        continue
                    yield event
                    continue
                if ended:
                    return
                self.idle(0.0)  # nothing more for now: the adapter commits what it holds
                with self._cond:
                    self._cond.wait_for(partial(self._beyond, index), timeout=self.poll_s)
        finally:
            with self._cond:
                self._leading = False
                self._cond.notify_all()

    def _beyond(self, index: int) -> bool:
        """Whether the event at `index` is read, or none will be (under the lock)."""
        return index - self._base < len(self._spool) or self.ended

    def committed(self, lines: Sequence[Line]) -> None:
        """Lines committed (in order): what they pass leaves the spool."""
        if not lines:
            return
        last = lines[-1].position.offset
        with self._cond:
            while self._spool and self._spool[0][0].position.offset <= last:
                _event, size = self._spool.popleft()
                self._base += 1
                self._spooled -= size
            self._cond.notify_all()

    def lag(self, after: Position | None) -> int | None:
        """Bytes read from the stream beyond `after` (what is still in the pipe cannot be
        known)."""
        skip_to = after.offset if after is not None and after.file == self.name else 0
        return max(0, self._read_bytes - skip_to)
