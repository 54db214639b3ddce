"""What the idle stack costs: CPU per program of a running `make up` with no load.

    make up                      # the local stack must be running, its engines in sync
    .venv/bin/python -m bench.idle --seconds 60

Samples the CPU time of every process of the stack (each supervisord program with all its
descendants; Airflow's by the role of each process: scheduler, dag-processor, api-server,
triggerer, task runs) at the start and the end of the window, and prints the cores each
used on average, the total, and the load average. Writes docs/bench/idle.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import psutil

from bench.plots import write_figures
from devkit.harness import example_pipeline, machine
from twinstream.platform.settings import REPO_ROOT, Settings
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import Supervisor

AIRFLOW_ROLES = ("scheduler", "dag-processor", "api-server", "triggerer", "tasks run")


def label(program: str, proc: psutil.Process) -> str:
    """The part of the stack a process belongs to: its program, Airflow's by role."""
    if not program.startswith("airflow"):
        return program
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return program
    role = next((r for r in AIRFLOW_ROLES if r in cmdline), None)
    return f"airflow {role}" if role else program


def processes(settings: Settings) -> dict[int, tuple[str, psutil.Process]]:
    """pid -> (label, process) for every process of the running stack."""
    supervisor = Supervisor(Layout.of(settings))
    if not supervisor.is_running():
        raise SystemExit("the local stack is not running: start it with `make up`")
    found: dict[int, tuple[str, psutil.Process]] = {}
    with_supervisord = [("supervisord", supervisor.pid())]
    programs = [(info.name, info.pid) for info in supervisor.processes() if info.pid]
    for program, pid in [*with_supervisord, *programs]:
        try:
            root = psutil.Process(pid)
            tree = [root] if program == "supervisord" else [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in tree:
            found[proc.pid] = (label(program, proc), proc)
    return found


def cpu(proc: psutil.Process) -> float | None:
    """The process's CPU seconds with those of its children that ended and were waited for:
    a short Airflow task run is counted in its parent even if no look saw it alive."""
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system + times.children_user + times.children_system


def sample(settings: Settings, seconds: float) -> dict[str, Any]:
    """Cores used per part over `seconds`. A process that starts within the window (a task
    run) is counted from its start; one that ends within it, in the parent that waited for
    it (all of its CPU, a little more than its share of the window)."""
    before = {pid: (lab, proc, cpu(proc)) for pid, (lab, proc) in processes(settings).items()}
    started = time.monotonic()
    time.sleep(seconds)  # the window measured: nothing to wait for, by design
    elapsed = time.monotonic() - started
    used_by: dict[str, float] = {}
    for pid, (lab, proc) in processes(settings).items():
        # Alive at the end; one that ended within the window is in its parent's children's
        # times (psutil's children_user and children_system).
        used = cpu(proc)
        if used is None:
            continue
        start = before[pid][2] if pid in before else 0.0
        used_by[lab] = used_by.get(lab, 0.0) + max(0.0, used - (start or 0.0))
    cores = {
        lab: round(u / elapsed, 3) for lab, u in sorted(used_by.items(), key=lambda kv: -kv[1])
    }
    return {
        "seconds": round(elapsed, 1),
        "cores_total": round(sum(used_by.values()) / elapsed, 3),
        "cores_by_part": cores,
        "load_average_1m": round(psutil.getloadavg()[0], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()
    figures = {**sample(example_pipeline(), args.seconds), "machine": machine()}
    for part, cores in figures["cores_by_part"].items():
        print(f"{part:28s} {cores:6.3f} cores")
    print(f"idle stack: {figures['cores_total']:.3f} cores over {figures['seconds']:.0f} s")
    write_figures(args.output, "idle", figures, echo=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
