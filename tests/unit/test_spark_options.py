"""The driver JVM's options (twinstream.spark): the class archive `make install` writes is
mapped by every session once it exists, added to the session's own options, and never
while a JVM is writing one."""

from __future__ import annotations

from pathlib import Path

from twinstream.config import Settings
from twinstream.spark import DRIVER_JAVA_OPTIONS, class_archive, driver_java_options


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
