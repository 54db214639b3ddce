"""The installed environment is the pinned one (a wrong pin or a skipped step fails here)."""

import re
import subprocess
import sys
from importlib import metadata

import pytest

from twinstream.platform.settings import REPO_ROOT, load_settings
from twinstream.stack.core import REQUIRED_JARS, check_jars


def _pins():
    pins = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==(\S+)", line)
            assert match, f"requirements.txt: {line!r} is not an exact pin"
            pins[match[1]] = match[2]
    return pins


def test_every_requirement_is_pinned_exactly():
    lines = [
        ln.split("#", 1)[0].strip()
        for ln in (REPO_ROOT / "requirements.txt").read_text().splitlines()
    ]
    loose = [ln for ln in lines if ln and "==" not in ln]
    assert loose == []
    assert {"apache-airflow", "pyspark", "kazoo", "great-expectations"} <= set(_pins())
    assert _pins()["apache-airflow"].startswith("3.3.")
    assert _pins()["great-expectations"].startswith("1.")


@pytest.mark.parametrize(("name", "version"), sorted(_pins().items()))
def test_installed_version_equals_the_pin(name, version):
    assert metadata.version(name) == version


def test_pyspark_python_files_are_pysparks_own_not_pyspark_clients():
    import pyspark

    assert pyspark.__version__ == _pins()["pyspark"]


def test_pip_check_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_constraints_pin_what_is_installed():
    """constraints.txt must describe this environment, or `make install` drifts silently."""
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            assert metadata.version(name) == version, name


def test_maven_step_fetched_every_jar_folder():
    settings = load_settings()
    check_jars(settings)
    assert set(REQUIRED_JARS) == {p.name for p in settings.jars_dir.iterdir() if p.is_dir()}
