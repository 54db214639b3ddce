"""What each task of an `audit_output_topic` run concluded, kept in the pipeline's audit
folder, so that `twinstream status` and the operator page show the last run's true outcome
task by task.

Guarantee: a task run inside `outcome_of` leaves exactly one record for its run, written
after it ends: passed with its summary, or failed with the error that failed it (the
error is raised on unchanged). A retried task's later try replaces its earlier record. A
run passes only when every task that recorded passed: a report that says "ok" cannot hide
the run's failed `agreement` task.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

RUNS = "runs"
# Runs whose records are kept (the newest); older folders are removed as new runs record.
KEEP = 20
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class TaskOutcome:
    task: str
    ok: bool
    summary: str
    # When the task ended, ISO 8601 in UTC.
    at: str


@dataclass(frozen=True)
class RunOutcome:
    run: str
    tasks: list[TaskOutcome]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tasks)

    @property
    def at(self) -> str:
        return max(t.at for t in self.tasks)


def run_folder(audit_dir: Path, run_id: str) -> Path:
    """The run's folder: its id with every character a path could misread replaced."""
    return audit_dir / RUNS / _UNSAFE.sub("_", run_id)


def record(
    audit_dir: Path,
    run_id: str,
    task: str,
    ok: bool,
    summary: str,
    clock: Callable[[], float] = time.time,
) -> Path:
    """One task's outcome for `run_id`, replacing an earlier try's."""
    folder = run_folder(audit_dir, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    at = datetime.fromtimestamp(clock(), UTC).isoformat(timespec="seconds")
    data = {"run": run_id, **asdict(TaskOutcome(task, ok, summary, at))}
    path = folder / f"{_UNSAFE.sub('_', task)}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1))
    temporary.replace(path)
    _prune(audit_dir)
    return path


@contextmanager
def outcome_of(audit_dir: Path, run_id: str, task: str) -> Iterator[Callable[[str], None]]:
    """Run a task's body and record how it ended; the body says its summary through the
    callable it is given (the last one said counts)."""
    said: list[str] = []
    try:
        yield said.append
    except BaseException as exc:
        record(audit_dir, run_id, task, False, str(exc) or type(exc).__name__)
        raise
    record(audit_dir, run_id, task, True, said[-1] if said else "passed")


def _runs(audit_dir: Path) -> list[Path]:
    """Run folders, newest first (by their newest record)."""
    root = audit_dir / RUNS
    if not root.is_dir():
        return []

    def newest(folder: Path) -> float:
        return max((p.stat().st_mtime for p in folder.glob("*.json")), default=0.0)

    return sorted((f for f in root.iterdir() if f.is_dir()), key=newest, reverse=True)


def last_run(audit_dir: Path) -> RunOutcome | None:
    """The newest run that recorded a task, with every task it recorded (by name); None when
    no run did. An unreadable record is logged and left out."""
    for folder in _runs(audit_dir):
        tasks, run = [], folder.name
        for path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                run = str(data["run"])
                tasks.append(
                    TaskOutcome(
                        str(data["task"]), bool(data["ok"]), str(data["summary"]), str(data["at"])
                    )
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("audit task record %s unreadable (%s); left out", path, exc)
        if tasks:
            return RunOutcome(run, tasks)
    return None


def _prune(audit_dir: Path, keep: int = KEEP) -> None:
    for folder in _runs(audit_dir)[keep:]:
        shutil.rmtree(folder, ignore_errors=True)
