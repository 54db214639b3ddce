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
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# Lines longer than this are not read whole: reported with their position (`TooLong`) and
# skipped to their end, so that one runaway line cannot exhaust the adapter's memory.
MAX_LINE_BYTES = 1_000_000
# How much of a file's start identifies it (with its inode).
HEAD_BYTES = 256


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
