"""The driver JVM's options (twinstream.engine.spark): the class archive `make install` writes is
mapped by every session once it exists, added to the session's own options, and never
while a JVM is writing one."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from twinstream.engine.spark import (
    DRIVER_JAVA_OPTIONS,
    class_archive,
    cluster_conf,
    driver_java_options,
    pin_code,
)
from twinstream.platform.settings import Settings, SettingsError, load_settings


def test_no_archive_no_option_the_sessions_own_options_kept(tmp_path: Path) -> None:
    settings = Settings(jars_dir=tmp_path)
    assert driver_java_options(settings, {}) is None
    assert driver_java_options(settings, {DRIVER_JAVA_OPTIONS: "-Xss4m"}) == "-Xss4m"


def test_an_archive_is_mapped_by_every_session_but_the_one_writing_it(tmp_path: Path) -> None:
    settings = Settings(jars_dir=tmp_path)
    archive = class_archive(settings)
    archive.write_bytes(b"archive")
    assert driver_java_options(settings, {}) == f"-XX:SharedArchiveFile={archive}"
    assert driver_java_options(settings, {DRIVER_JAVA_OPTIONS: "-Xss4m"}) == (
        f"-Xss4m -XX:SharedArchiveFile={archive}"
    )
    writing = {DRIVER_JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={archive}.partial"}
    assert driver_java_options(settings, writing) == writing[DRIVER_JAVA_OPTIONS]


def test_a_cluster_master_gets_the_cores_and_the_pipelines_path(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/srv/pipelines")
    settings = Settings(spark_cores=2)
    assert cluster_conf(settings, "local[2]") == {}
    assert cluster_conf(settings, "") == {}
    assert cluster_conf(settings, "spark://m:7077") == {
        "spark.cores.max": "2",
        "spark.executorEnv.PYTHONPATH": "/srv/pipelines",
    }


def test_the_engines_master_is_configuration(monkeypatch) -> None:
    assert Settings().engine_spark_master == "local[2]"
    monkeypatch.setenv("TWINSTREAM_SPARK_MASTER", "spark://spark-master:7077")
    assert load_settings().engine_spark_master == "spark://spark-master:7077"
    monkeypatch.setenv("TWINSTREAM_SPARK_MASTER", "")
    assert load_settings().engine_spark_master == ""
    monkeypatch.setenv("TWINSTREAM_SPARK_MASTER", "spark:/oops")
    with pytest.raises(SettingsError, match="TWINSTREAM_SPARK_MASTER"):
        load_settings()
    monkeypatch.delenv("TWINSTREAM_SPARK_MASTER")
    # The local stack's standalone master wins when the stack runs one.
    monkeypatch.setenv("TWINSTREAM_SPARK_STANDALONE", "true")
    assert load_settings().engine_spark_master == "spark://127.0.0.1:7077"


def test_more_spark_settings_are_spark_key_value_pairs(monkeypatch) -> None:
    monkeypatch.setenv(
        "TWINSTREAM_SPARK_CONF",
        "spark.executor.memory=2g; spark.executor.extraJavaOptions=-Da=1 -Db=2,3",
    )
    assert load_settings().spark_conf == {
        "spark.executor.memory": "2g",
        "spark.executor.extraJavaOptions": "-Da=1 -Db=2,3",
    }
    monkeypatch.setenv("TWINSTREAM_SPARK_CONF", "executor.memory=2g")
    with pytest.raises(SettingsError, match=r"spark\.<key>=<value>"):
        load_settings()


def test_a_pinned_pipeline_runs_as_loaded_in_a_worker_after_its_file_changed(
    tmp_path: Path,
) -> None:
    """A Python worker started after the owner wrote the next version over the pipeline's
    file still runs the code the engine loaded (pickled by value), where by reference it
    imported the file as it is now (the names it needs gone: AttributeError)."""
    import contextlib
    import subprocess
    import sys
    import uuid

    from pyspark import cloudpickle

    # What a worker does with a pickled command: load it, and call it.
    worker_code = "import pickle, sys; print(pickle.load(sys.stdin.buffer).apply(21))"
    name = f"pinned_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "pipeline.py").write_text(
        "class StepV2:\n    def apply(self, x):\n        return x * 2\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(f"{name}.pipeline")
        # Its package's modules under its folder; none of another package beside it.
        (tmp_path / "bystander.py").write_text("")
        importlib.import_module("bystander")
        assert pin_code(f"{name}.pipeline:pipeline") == [name, f"{name}.pipeline"]
        payload = cloudpickle.dumps(module.StepV2())
        # Version 1, as a rollback writes it: no StepV2.
        (folder / "pipeline.py").write_text(
            "class Step:\n    def apply(self, x):\n        return x\n"
        )
        worker = subprocess.run(
            [sys.executable, "-c", worker_code],
            input=payload,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            check=False,
        )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("bystander", None)
        for pinned in [m for m in sys.modules if m.split(".")[0] == name]:
            with contextlib.suppress(ValueError):  # not pinned: the test fails below
                cloudpickle.unregister_pickle_by_value(sys.modules.pop(pinned))
    assert worker.returncode == 0, worker.stderr.decode()
    assert worker.stdout.decode().strip() == "42"
