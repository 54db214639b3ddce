"""`twinstream new-pipeline` writes a Keyed pipeline that passes its own tests, as a user
runs them: pytest in the folder it was written to (plain Python and a local Spark, no
stack)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from twinstream.ops import cli


def test_the_skeleton_passes_its_own_test(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert cli.main(["new-pipeline", "shop_totals", "--dir", str(tmp_path)]) == 0
    assert "[shop_totals]" in capsys.readouterr().out
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "shop_totals"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # All three ran: the step in plain Python, the reference run's verdicts, and one batch
    # against five (a skipped or uncollected test would not fail the return code).
    assert "3 passed" in result.stdout


def test_a_bad_name_or_an_existing_folder_is_refused_by_name(tmp_path: Path, capsys):
    assert cli.main(["new-pipeline", "Bad-Name", "--dir", str(tmp_path)]) == 2
    assert "is not a pipeline name" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert cli.main(["new-pipeline", "taken", "--dir", str(tmp_path)]) == 2
    assert "exists already" in capsys.readouterr().err
