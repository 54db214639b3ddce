"""A pipeline's version: its declared name and a digest of its code, which changes with any
change of its folder's Python files (but its tests) and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinstream.contract import ContractError, Pipeline
from twinstream.platform import registry
from twinstream.platform.settings import load_settings
from twinstream.platform.versions import CodeVersion, digest

PIPELINE = """from twinstream.contract import Pipeline

pipeline = Pipeline(
    name="clicks",
    schema="user STRING, n INT",
    transform=lambda df: df,
    value=["n"],
    version={version!r},
)
"""


def _write(root: Path, version: str = "1", body: str = "") -> Path:
    folder = root / "versioned_clicks"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    (folder / "pipeline.py").write_text(PIPELINE.format(version=version) + body)
    pipelines = root / "pipelines.toml"
    pipelines.write_text('[clicks]\nmodule = "versioned_clicks.pipeline"\n')
    return pipelines


def test_the_digest_changes_with_the_code_and_nothing_else(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = digest(tmp_path)
    assert len(first) == 12
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.py").write_text("cache")
    (tmp_path / "notes.txt").write_text("not code")
    assert digest(tmp_path) == first
    # Its tests are not what an engine runs: adding or changing one is no new version.
    for test in ("test_a.py", "a_test.py", "conftest.py", "sub/test_b.py"):
        (tmp_path / test).write_text("def test(): pass\n")
    assert digest(tmp_path) == first
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert digest(tmp_path) != first
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    assert digest(tmp_path) == first
    # The same bytes under another name are other code.
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")
    assert digest(tmp_path) != first


def test_a_version_is_shown_as_declared_plus_digest_and_read_back():
    assert str(CodeVersion("2", "0123456789ab")) == "2+0123456789ab"
    assert str(CodeVersion("", "0123456789ab")) == "0123456789ab"
    for shown in ("2+0123456789ab", "0123456789ab", "1.2-rc+ffffffffffff"):
        assert str(CodeVersion.parse(shown)) == shown


def test_a_pipelines_version_is_its_declared_one_and_its_folders_digest(tmp_path):
    settings = load_settings(pipelines_file=_write(tmp_path / "v1", "7"), pipeline="clicks")
    pipeline = registry.load(settings)
    version = registry.code_version(settings, pipeline)
    assert version.declared == "7"
    assert (
        version.digest
        == digest(tmp_path / "v1" / "versioned_clicks")
        == registry.code_digest(settings)
    )
    # An undeclared change (the same declared version) is still another digest.
    _write(tmp_path / "v1", "7", body="\n# a 20-minute session gap\n")
    assert registry.code_digest(settings) != version.digest


def test_code_that_cannot_be_found_has_no_digest_rather_than_a_false_one(tmp_path):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text('[gone]\nmodule = "nowhere.pipeline"\n')
    settings = load_settings(pipelines_file=pipelines, pipeline="gone")
    assert registry.code_digest(settings) == ""


@pytest.mark.parametrize("version", ["two words", "x" * 41, "a/b"])
def test_a_version_that_cannot_be_a_header_or_a_label_is_refused(version):
    with pytest.raises(ContractError, match="version"):
        Pipeline(name="p", schema="n INT", transform=lambda df: df, value=["n"], version=version)
