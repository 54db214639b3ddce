"""The benchmark helpers' arithmetic: drain rates and rate series from watermark samples."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from bench.plots import mark_styles, plot, rate_series
from devkit.chaos import KINDS, granted_session_s
from devkit.harness import drain_rate, summary, wait_gone
from twinstream.platform.settings import load_settings


def test_the_drain_rate_leaves_the_start_up_out():
    # 3 s of start-up without output, then 1000 outputs/s until 4000.
    samples = [(0.0, 0), (1.0, 0), (2.0, 0), (3.0, 500), (4.0, 1500), (5.0, 2500), (6.5, 4000)]
    rate, seconds = drain_rate(samples, 4000)
    assert seconds == pytest.approx(3.5)
    assert rate == pytest.approx(3500 / 3.5)


def test_a_drain_that_never_finished_is_an_error_not_a_figure():
    with pytest.raises(ValueError, match="do not cover a drain of 4000"):
        drain_rate([(0.0, 0), (1.0, 100), (2.0, 300)], 4000)
    with pytest.raises(ValueError, match="do not cover"):
        drain_rate([(0.0, 0), (1.0, 0)], 10)


def test_rate_series_differences_successive_samples():
    xs, ys = rate_series([(10.0, 0), (10.5, 100), (11.5, 400), (11.5, 400)], t0=10.0)
    assert xs == [0.5, 1.5]
    assert ys == [200.0, 300.0]


def test_rate_series_over_a_window_smooths_batches():
    # A batch of 100 lands every 2 s, sampled every 0.5 s.
    samples = [(t / 2, 100 * (t // 4)) for t in range(0, 17)]
    _, per_sample = rate_series(samples, t0=0.0)
    assert max(per_sample) == 200.0
    assert min(per_sample) == 0.0
    xs, ys = rate_series(samples, t0=0.0, window_s=4.0)
    assert xs[0] == 4.0  # none before a whole window
    assert [y for x, y in zip(xs, ys, strict=True) if x >= 4.0] == [50.0] * 9


def test_each_kind_of_mark_has_its_own_colour_and_one_legend_entry():
    styles = mark_styles([(1.0, "sigstop"), (2.0, "sigstop"), (3.0, "expire"), (4.0, "expire")])
    assert [legend for _, _, legend in styles] == ["sigstop", None, "expire", None]
    colours = [colour for _, colour, _ in styles]
    assert colours[0] == colours[1]
    assert colours[2] == colours[3]
    assert colours[0] != colours[2]


def test_a_plot_is_written(tmp_path):
    path = plot(
        tmp_path / "p.png",
        "t",
        {"rate": ([0, 1, 2], [1, 2, 3])},
        "events/s",
        marks=[(1.0, "kill")],
        second=("ms", {"latency": ([0, 1], [5, 6])}),
    )
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_the_expiry_freeze_outlasts_the_session_zookeeper_grants(tmp_path):
    settings = load_settings(state_dir=tmp_path)
    # The client asks for 0.2 s; with tickTime 500 ms ZooKeeper grants no less than 1 s.
    assert settings.zk_session_timeout_s < 1.0
    assert granted_session_s(settings) == 1.0
    assert KINDS == ("kill", "sigstop", "expire")


def test_a_summary_keeps_the_rounds_in_order_and_its_p99_is_the_worst_of_few():
    figures = summary([2.0, 1.25, 9.5, 1.5])
    assert figures == {"n": 4, "median": 1.75, "p99": 9.5, "worst": 9.5, "all": [2, 1.25, 9.5, 1.5]}
    hundred = summary([float(i) for i in range(100)])
    assert hundred["p99"] == 99.0


def test_wait_gone_returns_once_a_process_has_exited():
    proc = subprocess.Popen(["sleep", "0.3"])
    wait_gone({proc.pid}, timeout_s=10)
    # Exited: reaped or a zombie waiting to be (a killed engine's JVM is the latter).
    assert proc.wait(timeout=1) == 0


def test_wait_gone_says_which_processes_outlived_it():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(AssertionError, match=str(proc.pid)):
            wait_gone({proc.pid}, timeout_s=0.3)
    finally:
        proc.kill()
        proc.wait()


def test_top_functions_count_own_samples_and_samples_with_callees(tmp_path):
    from bench.profile import top_functions

    collapsed = tmp_path / "driver.txt"
    collapsed.write_text(
        "main (engine.py:70);process_batch (engine.py:516);rows_of (pipeline.py:290) 6\n"
        "main (engine.py:70);process_batch (engine.py:520);on_batch (gate.py:180) 3\n"
        "main (engine.py:71);sleep (time.py:1) 1\n"
        "not a stack line\n"
    )
    top = top_functions(collapsed)
    assert top["samples"] == 10
    assert top["own"][0] == ("rows_of (pipeline.py)", 60.0)
    # Line numbers do not split a function: process_batch is on 9 of 10 stacks.
    assert ("process_batch (engine.py)", 90.0) in top["with_callees"]
    assert top["with_callees"][0] == ("main (engine.py)", 100.0)


def test_the_plain_pipe_computes_the_pairs_outputs_for_valid_records():
    """bench/drain.py's ceiling does the pair's work: for every valid record of the golden
    file, its output is byte for byte what the hostmetrics pipeline published. (Its own
    validation is a sketch, not the pair's: the drain's backlog holds valid records only,
    and so does this comparison.)"""
    import gzip
    import json
    from pathlib import Path

    from bench.plain_pipe import transform

    golden = Path(__file__).parents[2] / "data" / "hostmetrics-golden.jsonl.gz"
    windows: dict[str, Any] = {}
    compared = 0
    with gzip.open(golden, "rt") as lines:
        for msg_id, line in enumerate(lines):
            row = json.loads(line)
            if row["kind"] != "out":
                continue
            key, value = transform(windows, msg_id, row["raw"].encode())
            assert (key, value) == (row["key"], row["value"]), msg_id
            compared += 1
    assert compared > 2000
    assert transform(windows, 9, b'{"host": "h"}')[0] is None  # a dead letter, no output


def test_scale_out_reads_the_timings_of_the_drains_largest_batches(tmp_path):
    from bench.scale_out import batch_timings

    def line(total: int, rows: str, job: int, gate: int) -> str:
        return (
            f"2026-11-26 INFO engine=a twinstream.engine.app: engine a pipeline p: 2 batches "
            f"sampled, medians: {total} ms (latestOffset 3, stateCommit 4), {rows} input rows; "
            f"in addBatch, of 2 batches: job {job} ms, gate {gate} ms"
        )

    log = tmp_path / "engine-a-1.log"
    log.write_text("\n".join([line(900, "5,000", 700, 90), line(4086, "40,000", 3227, 261)]))
    log.write_text(log.read_text() + "\n" + line(700, "16", 300, 50) + "\nnoise\n")
    engine = SimpleNamespace(log_path=log)
    assert batch_timings(engine) == {  # type: ignore[arg-type]
        "total": 4086,
        "rows": 40000,
        "batches": 2,
        "job": 3227,
        "gate": 261,
    }


def test_figures_are_written_as_json_and_printed_unless_asked_not_to(tmp_path, capsys):
    from bench.plots import write_figures

    path = write_figures(tmp_path / "out", "drain", {"events_per_s": 5159})
    assert path.read_text() == '{\n  "events_per_s": 5159\n}\n'
    assert '"events_per_s": 5159' in capsys.readouterr().out
    write_figures(tmp_path / "out", "idle", {"cores": 0.37}, echo=False)
    assert capsys.readouterr().out == ""


def test_the_engine_profile_splits_samples_into_the_parts_of_a_records_path(tmp_path):
    """The step's frames are its own part even inside the processor's; a JVM sample goes to
    the first part whose marker it holds (the compiler before the task it compiles for)."""
    from bench.engine_profile import JVM_PARTS, PYTHON_PARTS, load_collapsed, split

    python = tmp_path / "python.collapsed"
    python.write_text(
        'process 2:"python -m pyspark.daemon";'
        "handleInputRows (twinstream/engine/state/processor.py:107)"
        ";run (twinstream/engine/state/keyed.py:75);step (pipelines/hostmetrics/logic.py:103) 7\n"
        'process 2:"python -m pyspark.daemon";'
        "handleInputRows (twinstream/engine/state/processor.py:99)"
        " 3\n"
        'process 2:"python -m pyspark.daemon";dump_stream (pyspark/serializers.py:70) 5\n'
        'process 1:"engine.py";process_batch (twinstream/engine/app.py:637)'
        ";rows_of (twinstream/engine/pipeline.py:390) 4\n"
        'process 1:"engine.py";on_batch (twinstream/core/gate.py:262)'
        ";_publish (twinstream/core/gate.py:657) 2\n"
        'process 1:"engine.py";zk_loop (kazoo/protocol/connection.py:537) 1\n'
    )
    parts = split(load_collapsed(python), PYTHON_PARTS, ["pipelines/hostmetrics/"])
    assert parts == {
        "worker: the pipeline's step": 7,
        "worker: twinstream's processor (dicts in, frame out)": 3,
        "worker: pyspark's Arrow and pandas conversions": 5,
        "driver: the batch to Python (toArrow, assemble)": 4,
        "driver: the Kafka transaction": 2,
        "driver: other threads (py4j, kazoo, admin API)": 1,
    }
    jvm = tmp_path / "jvm.collapsed"
    jvm.write_text(
        "start_thread;CompileBroker::compiler_thread_loop;C2Compiler::compile_method 9\n"
        "Thread.run;Executor$TaskRunner.run;ShuffleMapTask.runTask;Generated.processNext 6\n"
        "Thread.run;ResultTask.runTask;Dataset.$anonfun$collectAsArrowToPython$6 2\n"
        "Thread.run;ResultTask.runTask;TransformWithStateInPySparkExec.compute 3\n"
        "Thread.run;MicroBatchExecution.runBatch 1\n"
        "not a sample line\n"
    )
    assert split(load_collapsed(jvm), JVM_PARTS) == {
        "JIT compilers": 9,
        "read Kafka, validate, shuffle (map stage)": 6,
        "collect to the driver (toArrow)": 2,
        "stateful task: Arrow to and from Python, state store": 3,
        "micro-batch planning and commits": 1,
    }
