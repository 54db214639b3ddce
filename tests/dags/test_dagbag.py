"""DagBag policy for every DAG file in dags/, plus proof that the policy can fail."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.dags.policy import dag_problems
from twinstream.platform.settings import REPO_ROOT

DAGS = REPO_ROOT / "dags"
DAG_FILES = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))


def _dagbag(folder: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


@pytest.fixture(scope="module")
def dagbag():
    return _dagbag(DAGS)


def test_there_are_dags_to_check():
    assert DAG_FILES, "dags/ holds no DAG file"


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}


def test_every_file_defines_the_dag_named_after_it(dagbag):
    assert sorted(dagbag.dag_ids) == sorted(p.stem for p in DAG_FILES)


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.stem)
def test_dag_follows_the_policy(dagbag, path):
    assert dag_problems(dagbag.dags[path.stem], path) == []


def test_parsing_does_no_work():
    """Parse every DAG file in a fresh interpreter: no network, no heavy imports, under 2 s."""
    code = (
        "import time, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "t = time.perf_counter()\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "elapsed = time.perf_counter() - t\n"
        "heavy = sorted(m for m in ('pyspark', 'great_expectations', 'kazoo', 'confluent_kafka')"
        " if m in sys.modules)\n"
        "print('RESULT', elapsed, ','.join(heavy) or '-', len(bag.import_errors))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    _, elapsed_s, heavy, errors = next(ln for ln in out if ln.startswith("RESULT ")).split()
    elapsed = float(elapsed_s)
    assert int(errors) == 0
    assert elapsed < 2.0, f"parsing dags/ took {elapsed:.2f}s"
    assert heavy == "-", f"DAG files import {heavy} at parse time"


def test_policy_catches_a_broken_and_a_sloppy_dag(tmp_path):
    (tmp_path / "broken.py").write_text("from airflow.sdk import dag\nraise RuntimeError('x')\n")
    sloppy = tmp_path / "sloppy.py"
    sloppy.write_text(
        "from datetime import datetime\n"
        "from airflow.sdk import dag, task\n"
        "@dag(dag_id='other_name', start_date=datetime(2026, 1, 1))\n"
        "def d():\n"
        "    @task\n"
        "    def t():\n"
        "        pass\n"
        "    t()\n"
        "d()\n"
    )
    start = time.perf_counter()
    bag = _dagbag(tmp_path)
    assert time.perf_counter() - start < 30
    assert any("broken.py" in path for path in bag.import_errors)
    problems = "\n".join(dag_problems(bag.dags["other_name"], sloppy))
    for expected in ("differs from the file name", "no tags", "no doc_md", "no owner", "retries"):
        assert expected in problems
    assert "schedule must be passed explicitly" in problems
    assert "catchup must be passed explicitly" in problems
