"""The driver JVM's options (twinstream.engine.spark): the class archive `make install` writes is
mapped by every session once it exists, added to the session's own options, and never
while a JVM is writing one."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinstream.engine.spark import (
    DRIVER_JAVA_OPTIONS,
    class_archive,
    cluster_conf,
    driver_java_options,
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
