"""A publisher adapter's standard input (twinstream.edge.sources.StreamSource): read once,
from the start, leading or not; each line once with its line number and byte offset; a
resume skips the lines up to the last published byte offset; a line too long, lines a
standby's full spool dropped and a stream that is not the one the last active was fed are
reported, never passed over in silence; `twinstream publish --source -` runs it."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable

import pytest

from tests.unit.edge.test_publisher_adapter import TOPICS, Cluster, dies_at_third_commit
from twinstream.edge.publisher import SEQ_HEADER, SOURCE_HEADER, PublisherAdapter, Status
from twinstream.edge.sources import (
    STDIN,
    Event,
    Line,
    Lost,
    Position,
    StreamSource,
    TooLong,
    stream_position,
)
from twinstream.ops import cli


@pytest.fixture(autouse=True)
def _one_pipeline_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's environment names the pipeline these commands work on (the
    repository's file lists two: with none chosen, they refuse)."""
    monkeypatch.setenv("TWINSTREAM_PIPELINE", "hostmetrics")


def wait_for(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def read_all(data: bytes, **kw: object) -> StreamSource:
    """A source over `data`, read to its end (as a standby reads while it waits)."""
    source = StreamSource(io.BytesIO(data), poll_s=0.01, **kw)  # type: ignore[arg-type]
    source.start()
    wait_for(lambda: source.ended)
    return source


def events(source: StreamSource, after: Position | None = None) -> list[Event]:
    return list(source.lines(after, threading.Event()))


def texts(found: list[Event]) -> list[str]:
    return [e.raw.decode() for e in found if isinstance(e, Line)]


def test_each_line_once_with_its_line_number_and_byte_offset_to_the_end():
    source = read_all(b'{"n":1}\n{"n":2}\r\n{"n":3}')
    found = events(source)
    assert texts(found) == ['{"n":1}', '{"n":2}', '{"n":3}']  # the last has no line break
    assert [e.position for e in found if isinstance(e, Line)] == [
        stream_position(1, 8),
        stream_position(2, 17),
        stream_position(3, 24),
    ]
    second = found[1]
    assert isinstance(second, Line)
    assert second.position.text() == "stdin@0.L2:17"
    assert second.position.file == STDIN
    assert Position.parse("stdin@0.L2:17") == second.position
    assert source.ended


def test_a_resume_skips_the_lines_up_to_the_last_published_offset_of_another_adapter():
    """Two adapters fed the same bytes: the second resumes right after the first's last
    published line, by its position alone."""
    data = b"".join(json.dumps({"n": i}).encode() + b"\n" for i in range(10))
    first = events(read_all(data))
    published = first[3]
    assert isinstance(published, Line)
    second = read_all(data)
    assert texts(events(second, after=published.position)) == [
        json.dumps({"n": i}) for i in range(4, 10)
    ]


def test_a_position_of_another_source_reads_standard_input_from_its_start():
    source = read_all(b"a\nb\n")
    file_position = Position("in.jsonl", 12, "abc", 2)
    assert texts(events(source, after=file_position)) == ["a", "b"]


def test_a_line_too_long_is_reported_with_its_position_and_the_next_ones_follow():
    source = read_all(b"ok\n" + b"x" * 50 + b"\nnext\n", max_line_bytes=20)
    found = events(source)
    assert texts(found) == ["ok", "next"]
    (too_long,) = [e for e in found if isinstance(e, TooLong)]
    assert (too_long.length, too_long.position) == (50, stream_position(2, 54))


def test_a_line_not_utf8_is_given_as_it_is():
    source = read_all(b"\xff\xfe\n")
    assert [e.raw for e in events(source) if isinstance(e, Line)] == [b"\xff\xfe"]


def test_a_csv_header_comes_with_every_line_also_after_a_resume():
    data = b"host,cpu\nh1,0.5\nh2,0.7\n"
    found = events(read_all(data, header=True))
    assert [(e.header, e.raw) for e in found if isinstance(e, Line)] == [
        (b"host,cpu", b"h1,0.5"),
        (b"host,cpu", b"h2,0.7"),
    ]
    after = found[0]
    assert isinstance(after, Line)
    resumed = events(read_all(data, header=True), after=after.position)
    assert [(e.header, e.raw) for e in resumed if isinstance(e, Line)] == [(b"host,cpu", b"h2,0.7")]


def test_lines_a_standby_dropped_from_its_full_spool_are_reported_lost_with_their_bytes():
    """A standby keeps the newest spool_bytes of what it read; a takeover that needs older
    lines says which bytes are gone, then gives what it kept."""
    data = b"".join(b"line-%02d\n" % i for i in range(20))  # 8 bytes a line
    source = read_all(data, spool_bytes=40)
    found = events(source, after=stream_position(2, 16))
    lost = found[0]
    assert isinstance(lost, Lost)
    assert "bytes 16-120 of stdin (to its line 15)" in lost.why
    assert texts(found) == [f"line-{i:02d}" for i in range(15, 20)]
    # After the last line dropped, nothing is missing.
    assert texts(events(read_all(data, spool_bytes=40), after=stream_position(15, 120))) == [
        f"line-{i:02d}" for i in range(15, 20)
    ]


def test_a_stream_that_is_not_the_one_the_last_active_was_fed_is_reported():
    source = read_all(b"short\nlonger line\nlast\n")
    found = events(source, after=stream_position(1, 9))  # no line of this stream ends at 9
    assert isinstance(found[0], Lost)
    assert "inside this adapter's line 2" in found[0].why
    assert "not the stream the last active was fed" in found[0].why
    assert texts(found) == ["last"]


def test_the_active_reads_no_further_than_its_spool_until_a_commit_makes_room():
    """Backpressure, never a loss: the active keeps each line until a commit passes it."""
    read_end, write_end = os.pipe()
    with open(read_end, "rb") as reading, open(write_end, "wb", buffering=0) as writing:
        source = StreamSource(reading, spool_bytes=40, poll_s=0.01)
        source.start()
        stop = threading.Event()
        given: list[Line] = []
        idle = threading.Event()
        source.idle = lambda _s: idle.set()

        def lead() -> None:
            for event in source.lines(None, stop):
                assert isinstance(event, Line)
                given.append(event)

        leader = threading.Thread(target=lead, daemon=True)
        leader.start()
        wait_for(lambda: source._leading)
        writer = threading.Thread(
            target=lambda: writing.write(b"".join(b"line-%02d\n" % i for i in range(20))),
            daemon=True,
        )
        writer.start()
        wait_for(lambda: len(given) == 5)
        time.sleep(0.1)
        assert len(given) == 5  # the spool is full: nothing more is read
        assert source.read_bytes <= 48
        source.committed(given[:5])  # a commit passes them
        wait_for(lambda: len(given) == 10)
        source.committed(given[5:10])
        source.committed([])
        wait_for(lambda: len(given) == 15)
        source.committed(given[10:15])
        wait_for(lambda: len(given) == 20)
        writer.join(5)
        stop.set()
        leader.join(5)
    assert [e.raw for e in given] == [b"line-%02d" % i for i in range(20)]


def test_its_lag_is_what_it_read_beyond_a_position():
    source = read_all(b"aaa\nbbb\nccc\n")
    assert source.lag(None) == 12
    assert source.lag(stream_position(1, 4)) == 8
    assert source.lag(stream_position(3, 12)) == 0
    assert source.lag(Position("in.jsonl", 1, "x", 4)) == 12  # another source's position


# -- with the adapter -----------------------------------------------------------------------


def stdin_adapter(
    name: str, source: StreamSource, cluster: Cluster, **kw: object
) -> PublisherAdapter:
    def factory(idle: Callable[[float], None]) -> StreamSource:
        source.idle = idle
        return source

    return PublisherAdapter(
        name,
        TOPICS,
        factory,
        cluster.producer,
        cluster.resume,
        key_field="host",
        sleep=lambda _s: None,
        **kw,  # type: ignore[arg-type]
    )


def lines_of(count: int) -> bytes:
    return b"".join(
        json.dumps({"host": f"h{i % 3}", "n": i}).encode() + b"\n" for i in range(count)
    )


def ns(cluster: Cluster) -> list[int]:
    return [json.loads(v)["n"] for v, _k, _h in cluster.committed]


def test_the_active_publishes_standard_input_to_its_end_and_is_done():
    cluster = Cluster()
    source = read_all(lines_of(25))
    one = stdin_adapter("s1", source, cluster, max_batch=10)
    one._leading.set()
    one.publish(1)
    assert ns(cluster) == list(range(25))
    assert cluster.committed[-1][2][SOURCE_HEADER] == "stdin@0.L25:" + str(len(lines_of(25)))
    assert one.finished.is_set()  # its end: done, without handing the lead on
    assert one.status.published == 25
    assert len(source._spool) == 0  # every line left the spool once committed


def test_a_new_active_fed_the_same_stream_resumes_right_after_the_last_committed_line():
    """The first active dies with a batch open; the standby, fed the same bytes through
    `tee`, read them all the while, and publishes from right after the last commit."""
    data = lines_of(40)
    cluster = Cluster()
    first = stdin_adapter("s1", read_all(data), cluster, max_batch=10)
    dies_at_third_commit(first)
    first._leading.set()
    first.publish(1)
    assert ns(cluster) == list(range(20))

    second = stdin_adapter("s2", read_all(data), cluster, max_batch=10)
    second._leading.set()
    second.publish(2)
    assert ns(cluster) == list(range(40))
    assert [int(h[SEQ_HEADER]) for _v, _k, h in cluster.committed] == list(range(1, 41))
    assert second.finished.is_set()


def test_lines_not_utf8_are_published_counted_and_logged_with_their_position(caplog):
    cluster = Cluster()
    one = stdin_adapter("s1", read_all(b'{"n":0}\n\xff{"n":1}\n{"n":2}\n'), cluster)
    one._leading.set()
    with caplog.at_level("WARNING"):
        one.publish(1)
    assert [v for v, _k, _h in cluster.committed][1] == b'\xff{"n":1}'
    assert one.status.not_utf8 == 1
    assert "the line at stdin@0.L2:17 is not UTF-8" in caplog.text


def test_the_active_reports_how_far_its_source_is_beyond_what_it_published():
    read_end, write_end = os.pipe()
    with open(read_end, "rb") as reading, open(write_end, "wb", buffering=0) as writing:
        source = StreamSource(reading, poll_s=0.01)
        source.start()
        cluster = Cluster()
        one = stdin_adapter("s1", source, cluster, max_batch=2)
        seen: list[tuple[int, int | None]] = []

        def sleep(_s: float) -> None:
            # Idle: what it holds is committed; what is its lag now?
            seen.append((one.status.published, one.source_lag()))
            if one.status.published == 4:
                writing.close()  # the end of standard input

        one._sleep = sleep
        assert one.source_lag() is None  # a standby knows nothing of its source's end
        writing.write(b"{}\n" * 4)
        wait_for(lambda: source.read_bytes == 12)
        one._leading.set()
        one.status.role = "active"
        one.publish(1)
    assert seen[-1] == (4, 0)  # all 12 bytes published
    assert one.finished.is_set()
    assert one.status.source_lag is None  # no longer leading


def test_the_lag_of_a_source_half_published_is_the_rest_of_it():
    source = read_all(b"{}\n" * 4)
    one = stdin_adapter("s1", source, Cluster())
    one._following = source
    one.status.role, one.status.position = "active", stream_position(1, 3).text()
    assert one.source_lag() == 9


# -- the command line -----------------------------------------------------------------------


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """What `twinstream publish --source ...` hands the adapter (no ZooKeeper, no Kafka)."""
    import signal

    from twinstream.edge import publisher

    seen: dict[str, object] = {}
    # The command sets SIGTERM and SIGINT to stop the adapter: not pytest's own handlers.
    monkeypatch.setattr(signal, "signal", lambda *_a: None)

    def run(*args: object, **kw: object) -> Status:
        seen.update(kw, source=args[2], pattern=args[3])
        return Status()

    monkeypatch.setattr(publisher, "run", run)
    return seen


def test_publish_source_dash_runs_an_adapter_on_standard_input(ran):
    assert cli.main(["publish", "--source", "-", "--format", "csv", "--id", "x"]) == 0
    assert (ran["source"], ran["stdin_format"], ran["metrics_port"]) == ("-", "csv", 0)
    assert cli.main(["publish", "--source", "-", "--metrics-port", "8811"]) == 0
    assert (ran["stdin_format"], ran["metrics_port"]) == ("jsonl", 8811)


def test_format_is_for_standard_input_only(ran, capsys):
    assert cli.main(["publish", "--source", "/data/in.csv", "--format", "csv"]) == 2
    assert "--format is for --source -" in capsys.readouterr().err
    assert ran == {}


def test_the_help_says_standard_input_cannot_be_read_twice(capsys):
    with pytest.raises(SystemExit):
        cli.main(["publish", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "Standard input cannot be read twice" in said
    assert "every adapter of the group must be fed the same bytes" in said


def test_standard_input_is_no_source_make_up_can_give(tmp_path):
    from twinstream.platform import registry
    from twinstream.platform.settings import SettingsError, load_settings

    path = tmp_path / "pipelines.toml"
    path.write_text('[shop]\nmodule = "shop.pipeline"\npublishers = { source = "-" }\n')
    with pytest.raises(SettingsError, match="standard input"):
        registry.stack(
            load_settings(pipeline="hostmetrics", pipelines_file=path, state_dir=tmp_path)
        )
