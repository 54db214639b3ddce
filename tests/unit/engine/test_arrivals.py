"""The arrival of inbound records from sampled high watermarks (twinstream.engine.arrivals): the
latency an engine reports of what it published."""

import time

import numpy as np
import pytest

from twinstream.core.rows import OUT, Output
from twinstream.engine.arrivals import Arrivals, ArrivalSampler


def rows(partition, *offsets):
    return [Output(o, OUT, None, "v", partition) for o in offsets]


def test_a_record_arrives_when_the_high_watermark_passes_its_offset_interpolated():
    arrivals = Arrivals(every_s=0.2)
    # 100 records a second on partition 0: high 0 at t=10, 20 at t=10.2, 40 at t=10.4.
    for i, high in enumerate((0, 20, 40)):
        arrivals.sample({0: high}, 10.0 + 0.2 * i)
    # Offset 9 is the tenth record: in the log once high reached 10, at t=10.1.
    latency = arrivals.latencies(rows(0, 9, 39), now=11.0)
    assert latency == pytest.approx([0.9, 0.6])


def test_rows_the_samples_do_not_bracket_have_no_latency():
    arrivals = Arrivals()
    arrivals.sample({0: 10, 1: 5}, 1.0)
    arrivals.sample({0: 20, 1: 5}, 2.0)
    # Offset 3 arrived before the first sample, 25 after the last; partition 2 is unknown.
    assert len(arrivals.latencies(rows(0, 3, 25) + rows(2, 1), now=3.0)) == 0
    assert arrivals.latencies(rows(0, 15), now=3.0) == pytest.approx([1.4])


def test_an_idle_partition_keeps_its_last_moment_so_a_late_record_is_timed_from_it():
    arrivals = Arrivals(keep_s=10, every_s=1)
    arrivals.sample({0: 7}, 0.0)
    for t in range(1, 3600):
        arrivals.sample({0: 7}, float(t))  # an hour idle: one sample replaced, not 3,600
    arrivals.sample({0: 8}, 3600.0)
    assert arrivals.latencies(rows(0, 7), now=3601.0) == pytest.approx([1.0])


def test_memory_is_bounded_by_the_time_kept():
    arrivals = Arrivals(keep_s=10, every_s=1)
    for t in range(1000):
        arrivals.sample({0: t}, float(t))
    assert len(arrivals._samples[0]) == 11
    assert len(arrivals.latencies(rows(0, 5), now=1000.0)) == 0  # older than kept


def test_twenty_thousand_rows_cost_milliseconds():
    arrivals = Arrivals(every_s=0.2)
    for i in range(3000):
        arrivals.sample({0: i * 10, 1: i * 10}, i * 0.2)
    batch = rows(0, *range(10_000, 20_000)) + rows(1, *range(10_000, 20_000))
    started = time.perf_counter()
    latency = arrivals.latencies(batch, now=600.0)
    assert len(latency) == 20_000
    assert time.perf_counter() - started < 0.5
    assert np.all(latency > 0)


def test_the_sampler_samples_until_stopped_and_survives_a_failing_read():
    arrivals = Arrivals(every_s=0.01)
    reads = []

    def highs():
        reads.append(1)
        if len(reads) == 2:
            raise RuntimeError("broker gone")
        return {0: len(reads)}

    sampler = ArrivalSampler(arrivals, highs, clock=lambda: float(len(reads)))
    sampler.start()
    deadline = time.monotonic() + 5
    while len(reads) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    sampler.join(2)
    assert not sampler.is_alive()
    assert len(arrivals._samples[0]) >= 3


def test_the_sampler_backs_off_while_kafka_does_not_answer():
    arrivals = Arrivals(every_s=0.01)
    reads = []

    def highs():
        reads.append(time.monotonic())
        return None  # InboundWatermarks.highs when Kafka does not answer

    sampler = ArrivalSampler(arrivals, highs)
    sampler.start()
    time.sleep(0.5)
    sampler.stop()
    sampler.join(2)
    # 0.01, 0.02, 0.04, 0.08, 0.16, 0.32 s: six reads in 0.5 s, not fifty.
    assert 2 <= len(reads) <= 8, len(reads)
