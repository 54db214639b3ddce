"""devkit.harness.Load with a generator: records made as they are sent (a
"longer than the scenario" load of 10**6 records cost 11 s to build as a list first), and
`planned` keeping the count a test compares with exact."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator
from typing import Any, cast

import pytest

from devkit import harness
from devkit.harness import Load, Pipeline
from twinstream.platform.settings import Settings

SETTINGS = cast(Settings, object())  # the fake publish below never reads it


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[bytes | None]:
    sent: list[bytes | None] = []

    def publish(_settings: Any, records: Iterable[bytes | None], **_kwargs: Any) -> None:
        sent.extend(records)

    monkeypatch.setattr(harness, "publish", publish)
    return sent


def records(count: int, made: list[int]) -> Iterator[bytes]:
    for i in range(count):
        made.append(i)
        yield str(i).encode()


def test_a_generator_is_sent_whole_and_its_planned_count_checked(published):
    made: list[int] = []
    load = Load(SETTINGS, records(5, made), 0, "t", planned=5)
    Pipeline.join_load(load)
    assert load.sent == 5
    assert len(published) == 5
    assert made == [0, 1, 2, 3, 4]


def test_a_load_that_runs_out_before_its_planned_count_fails_naming_both(published):
    load = Load(SETTINGS, records(4, []), 0, "t", planned=5)
    with pytest.raises(AssertionError, match="load sent 4 records of the 5 planned"):
        Pipeline.join_load(load)


def test_a_stopped_load_made_only_what_it_sent(monkeypatch: pytest.MonkeyPatch):
    started = threading.Event()
    sent: list[bytes | None] = []

    def publish(_settings: Any, records: Iterable[bytes | None], **_kwargs: Any) -> None:
        for record in records:
            sent.append(record)
            started.set()

    monkeypatch.setattr(harness, "publish", publish)
    made: list[int] = []
    load = Load(SETTINGS, records(10**9, made), 0, "t", planned=10**9)
    assert started.wait(5)
    load.stop()
    Pipeline.join_load(load, timeout_s=5)  # stopped: fewer than planned is no failure
    assert load.stopping
    assert load.sent == len(sent)
    # Made as sent: the generator ran one record ahead at most, not to its end.
    assert len(made) <= load.sent + 1 < 10**9
    assert list(itertools.islice(sent, 3)) == [b"0", b"1", b"2"]
