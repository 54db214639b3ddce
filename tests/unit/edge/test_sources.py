"""A publisher adapter's file source follows files as `tail -F` does, each line once with the
position right after it, and resumes right after a position (twinstream.edge.sources)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from twinstream.edge.sources import FileSource, Line, Lost, Position, TooLong


def follow(
    path: Path,
    actions: list[Callable[[], None]],
    after: Position | None = None,
    **kw: object,
) -> list[object]:
    """Read `path` from `after`; each time the source waits for more, the next action runs
    (a write, a rotation); once none is left, the source is stopped."""
    stop = threading.Event()
    todo = list(actions)

    def sleep(_s: float) -> None:
        if todo:
            todo.pop(0)()
        else:
            stop.set()

    source = FileSource(path, sleep=sleep, **kw)  # type: ignore[arg-type]
    return list(source.lines(after, stop))


def append(path: Path, text: str) -> Callable[[], None]:
    def act() -> None:
        with open(path, "a") as out:
            out.write(text)

    return act


def texts(events: list[object]) -> list[str]:
    return [e.raw.decode() for e in events if isinstance(e, Line)]


def test_a_growing_file_gives_each_complete_line_once(tmp_path):
    log = tmp_path / "in.jsonl"
    log.write_text("a\nb\n")
    events = follow(log, [append(log, "c\nhal"), append(log, "f\nd\n")])
    assert texts(events) == ["a", "b", "c", "half", "d"]
    assert [e.position.offset for e in events if isinstance(e, Line)] == [2, 4, 6, 11, 13]
    last = events[-1]
    assert isinstance(last, Line)
    assert last.raw == b"d"
    assert (last.position.file, last.position.inode) == ("in.jsonl", log.stat().st_ino)


def test_reading_resumes_right_after_a_position(tmp_path):
    log = tmp_path / "in.jsonl"
    log.write_text("a\nb\nc\n")
    first = follow(log, [])
    after = first[1]
    assert isinstance(after, Line)
    assert texts(follow(log, [], after=after.position)) == ["c"]
    assert Position.parse(after.position.text()) == after.position


def test_a_rotated_file_is_read_to_its_end_then_the_new_one_from_its_start(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("1\n2\n")

    def rotate() -> None:
        with open(log, "a") as out:
            out.write("3\n")  # written just before the rotation
        log.rename(tmp_path / "app.log.1")
        log.write_text("4\n5\n")

    assert texts(follow(log, [rotate, append(log, "6\n")])) == ["1", "2", "3", "4", "5", "6"]


def test_a_position_in_a_rotated_file_is_found_by_its_inode(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("1\n2\n3\n")
    after = follow(log, [])[0]
    assert isinstance(after, Line)
    log.rename(tmp_path / "app.log.1")
    log.write_text("4\n")
    assert texts(follow(log, [], after=after.position)) == ["2", "3", "4"]


def test_a_position_whose_file_is_gone_is_reported_lost_not_skipped(tmp_path):
    """Whether or not the file system hands the deleted file's inode to the new one (Linux
    often does), the new file is not taken for it: its first bytes differ."""
    log = tmp_path / "app.log"
    log.write_text("1\n2\n")
    after = follow(log, [])[0]
    assert isinstance(after, Line)
    os.remove(log)
    log.write_text("9\n")
    events = follow(log, [], after=after.position)
    assert isinstance(events[0], Lost)
    assert "rotated away and deleted" in events[0].why
    assert texts(events) == ["9"]


def test_a_truncated_file_is_read_again_from_its_start(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("1\n2\n")

    def copytruncate() -> None:
        log.write_text("3\n")

    assert texts(follow(log, [copytruncate])) == ["1", "2", "3"]


def test_a_folder_is_read_file_by_file_in_name_order(tmp_path):
    (tmp_path / "b.csv").write_text("b1\n")
    (tmp_path / "a.csv").write_text("a1\na2\n")
    events = follow(
        tmp_path,
        [append(tmp_path / "b.csv", "b2\n"), append(tmp_path / "c.csv", "c1\n")],
        pattern="*.csv",
    )
    assert texts(events) == ["a1", "a2", "b1", "b2", "c1"]
    assert {e.position.file for e in events if isinstance(e, Line)} == {"a.csv", "b.csv", "c.csv"}


def test_a_line_too_long_is_reported_with_its_position_and_the_next_ones_follow(tmp_path):
    log = tmp_path / "in.jsonl"
    log.write_text("ok\n" + "x" * 50 + "\nnext\n")
    events = follow(log, [], max_line_bytes=20)
    assert texts(events) == ["ok", "next"]
    too_long = [e for e in events if isinstance(e, TooLong)]
    assert [(e.length, e.position.offset) for e in too_long] == [(50, 54)]


def test_each_csv_files_header_comes_with_its_lines_also_after_a_resume(tmp_path):
    (tmp_path / "a.csv").write_text("host,cpu\nh1,0.5\nh2,0.7\n")
    events = follow(tmp_path, [append(tmp_path / "b.csv", "cpu,host\n0.1,h3\n")], header=True)
    lines = [e for e in events if isinstance(e, Line)]
    assert [(e.header, e.raw) for e in lines] == [
        (b"host,cpu", b"h1,0.5"),
        (b"host,cpu", b"h2,0.7"),
        (b"cpu,host", b"0.1,h3"),
    ]
    resumed = follow(tmp_path, [], after=lines[0].position, header=True)
    assert [(e.header, e.raw) for e in resumed if isinstance(e, Line)] == [
        (b"host,cpu", b"h2,0.7"),
        (b"cpu,host", b"0.1,h3"),
    ]


def test_the_lag_is_the_bytes_beyond_a_position_also_across_a_rotation(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("1\n22\n333\n")
    source = FileSource(log)
    assert source.lag(None) == 9
    first = follow(log, [])[0]
    assert isinstance(first, Line)
    assert source.lag(first.position) == 7
    log.rename(tmp_path / "app.log.1")
    log.write_text("4444\n")
    # The rotated file's rest, then the new one, which the source reads next.
    assert source.lag(first.position) == 7 + 5
    (tmp_path / "app.log.1").unlink()
    assert source.lag(first.position) == 5  # gone: its rest is lost, not lag


def test_the_lag_of_a_truncated_file_is_its_length_and_of_a_folder_the_later_files(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("1\n2\n3\n")
    last = follow(log, [])[-1]
    assert isinstance(last, Line)
    assert FileSource(log).lag(last.position) == 0
    log.write_text("9\n")  # copytruncate: read again from its start
    assert FileSource(log).lag(last.position) == 2
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text("a1\na2\n")
    (folder / "b.jsonl").write_text("b1\n")
    (folder / "c.txt").write_text("not matched\n")
    first = follow(folder, [], pattern="*.jsonl")[0]
    assert isinstance(first, Line)
    assert FileSource(folder, "*.jsonl").lag(first.position) == 3 + 3
    assert FileSource(folder, "*.jsonl").lag(None) == 9
