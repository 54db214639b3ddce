"""devkit.harness: a stalled engine's Python threads are written to its log on a wait's
timeout (SIGUSR1, registered by spark_jobs/engine.py with faulthandler), and the engine
goes on running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devkit.harness import EngineProcess, wait_for

# What spark_jobs/engine.py registers, in a process that waits as a stalled engine would.
STALLED = (
    "import faulthandler, signal, threading\n"
    "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    "print('ready', flush=True)\n"
    "threading.Event().wait(60)\n"
)


def test_a_running_engine_writes_its_threads_stacks_to_its_log_and_goes_on(tmp_path: Path):
    log = tmp_path / "engine-a.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", STALLED], stdout=out, stderr=out)
    try:
        engine = EngineProcess("a", "http://127.0.0.1:1", log, proc, "t")
        wait_for(lambda: "ready" in log.read_text(), 30, "the process's handler registered")
        engine.dump_threads()
        text = log.read_text()
        assert "most recent call first" in text, text
        assert "wait" in text
        assert proc.poll() is None  # still running
    finally:
        proc.kill()
        proc.wait(timeout=10)
    # An engine that has exited is not signalled.
    EngineProcess("a", "http://127.0.0.1:1", log, proc, "t").dump_threads()
