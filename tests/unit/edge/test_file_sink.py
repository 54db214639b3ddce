"""A subscriber adapter's file holds every record exactly once, however often the adapter
dies: its position is read back from the file (twinstream.edge.file_sink)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from twinstream.edge.file_sink import FileSink, SinkError
from twinstream.edge.reader import Record


def record(partition: int, offset: int, key: str = "k") -> Record:
    value = json.dumps({"host": key, "n": offset})
    return Record(
        topic="p.out",
        offset=offset,
        key=key,
        raw=value.encode(),
        msg_id=offset * 10,
        engine_id="a",
        epoch=1,
        timestamp_ms=0,
        partition=partition,
    )


def stream(count: int, partitions: int = 3) -> list[Record]:
    """`count` records over `partitions`, each partition's offsets rising with gaps (the
    transaction markers)."""
    offsets = [0] * partitions
    out = []
    for i in range(count):
        p = i % partitions
        out.append(record(p, offsets[p], key=f"h{i % 7}"))
        offsets[p] += 1 + (i % 3 == 0)
    return out


def last_offsets(records: list[Record]) -> dict[int, int]:
    return {r.partition: r.offset for r in records}


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_reopened_file_continues_after_each_partitions_last_offset(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    for r in stream(10):
        assert sink.write(r)
    sink.close()
    again = FileSink(path)
    assert again.position.offsets == last_offsets(stream(10)) == {0: 6, 1: 2, 2: 2}
    assert again.position.next_offsets() == {0: 7, 1: 3, 2: 3}
    again.close()
    written = lines(path)
    assert [(x["partition"], x["offset"]) for x in written] == [
        (r.partition, r.offset) for r in stream(10)
    ]
    assert written[1] == {
        "partition": 1,
        "offset": 0,
        "msg_id": 0,
        "key": "h1",
        "value": {"host": "h1", "n": 0},
    }


def test_a_record_delivered_again_is_not_written_twice(tmp_path):
    sink = FileSink(tmp_path / "out.jsonl")
    assert sink.write(record(0, 4))
    assert not sink.write(record(0, 4))
    assert not sink.write(record(0, 2))
    assert sink.write(record(1, 0))
    sink.close()
    assert len(lines(tmp_path / "out.jsonl")) == 2


def test_a_line_a_crash_cut_in_half_is_cut_and_read_again(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    for r in stream(4):
        sink.write(r)
    sink.close()
    with open(path, "a") as out:
        out.write('{"partition":0,"offset":9,"ms')  # the crash
    again = FileSink(path)
    assert again.position.offsets == last_offsets(stream(4))
    assert path.read_text().endswith("}\n")
    again.close()


def test_the_position_file_spares_reading_what_it_covers(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    for r in stream(6):
        sink.write(r)
    sink.sync()
    covered = sink.position.length
    for r in stream(9)[6:]:
        sink.write(r)
    sink._out.flush()  # written, not synced: the crash comes before the position file
    # Were the covered part read, this line would fail the open.
    data = path.read_bytes()
    path.write_bytes(b"X" * (covered - 1) + b"\n" + data[covered:])
    again = FileSink(path)
    assert again.position.offsets == last_offsets(stream(9))


def test_a_file_shorter_than_its_position_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    for r in stream(6):
        sink.write(r)
    sink.close()
    path.write_text("")
    with pytest.raises(SinkError, match=r"someone cut it.*Move both files away"):
        FileSink(path)


def test_a_line_the_adapter_did_not_write_is_refused(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("hello\n")
    with pytest.raises(SinkError, match="not one this adapter wrote"):
        FileSink(path)


def test_csv_has_its_header_once_and_one_line_a_record(tmp_path):
    path = tmp_path / "out.csv"
    sink = FileSink(path)
    sink.write(record(0, 0, key="two\nlines"))
    sink.close()
    again = FileSink(path)
    assert again.position.offsets == {0: 0}
    again.write(record(0, 1))
    again.close()
    text = path.read_text().splitlines()
    assert text[0] == "partition,offset,msg_id,key,value"
    assert len(text) == 3
    assert text[1].startswith("0,0,0,two\\nlines,")


def test_a_name_without_a_format_is_refused(tmp_path):
    with pytest.raises(SinkError, match=r"end in \.jsonl or \.csv"):
        FileSink(tmp_path / "out.txt")


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("name", ["out.jsonl", "out.csv"])
def test_killed_anywhere_any_number_of_times_every_record_is_in_the_file_once(tmp_path, seed, name):
    """The adapter dies at random points: between records, mid-line (the file cut at a
    random byte after its last sync) and with or without its position file; each restart
    reads on from the position it recovers, as the adapter does from Kafka."""
    rng = random.Random(seed)
    everything = stream(300)
    path = tmp_path / name
    for _life in range(6):
        sink = FileSink(path)
        nexts = sink.position.next_offsets()
        todo = [r for r in everything if r.offset >= nexts.get(r.partition, 0)]
        for i, r in enumerate(todo[: rng.randrange(1, 80)]):
            sink.write(r)
            if i % rng.randrange(5, 30) == 0:
                sink.sync()
        sink._out.flush()
        synced = sink.position.length
        size = path.stat().st_size
        sink._out.close()
        # The crash: what was not synced may be lost in part, anywhere in a line.
        path.write_bytes(path.read_bytes()[: rng.randrange(synced, size + 1)])
    sink = FileSink(path)
    nexts = sink.position.next_offsets()
    for r in everything:
        if r.offset >= nexts.get(r.partition, 0):
            sink.write(r)
    sink.close()
    got: list[tuple[int, int]]
    if name.endswith(".jsonl"):
        got = [(int(str(x["partition"])), int(str(x["offset"]))) for x in lines(path)]
    else:
        rows = path.read_text().splitlines()[1:]
        got = [(int(r.split(",")[0]), int(r.split(",")[1])) for r in rows]
    assert sorted(got) == sorted((r.partition, r.offset) for r in everything)
    for p in range(3):
        mine = [o for q, o in got if q == p]
        assert mine == sorted(mine)
