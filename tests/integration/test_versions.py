"""Which code an engine runs: its pipeline's declared version and the digest of its code,
on its GET /server and /metrics and in a header of every record it publishes; a change of
the pipeline's files while it runs is seen, never taken on silently (issue 51, point 1)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from devkit.harness import Pipeline, wait_for
from twinstream.platform.versions import digest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]

# The example's declaration under a version of its own: what an owner's `version="1"` is.
VERSIONED = """import dataclasses

from pipelines.hostmetrics.pipeline import pipeline as example

pipeline = dataclasses.replace(example, version="1")
"""


def test_an_engine_says_which_code_it_runs_stamps_its_output_and_sees_a_change_on_disk(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    # A package beside the stack's pipelines file, whose folder the engines put on the path.
    package = f"versioned_{uuid.uuid4().hex[:8]}"
    folder = Path(stack_env["TWINSTREAM_PIPELINES_FILE"]).parent / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "pipeline.py").write_text(VERSIONED)
    loaded = f"1+{digest(folder)}"
    p = Pipeline(stack_env, tmp_path / "pipeline", engine_ids=("a",), module=f"{package}.pipeline")
    try:
        a = p.start("a")
        p.wait_running(a)
        server = a.get("/server")
        assert (server["pipeline_version"], server["stale"]) == (loaded, False)
        p.join_load(p.load(300, rate=0))
        p.wait_published(299)
        outputs, progress = p.outputs(), p.progress()
        assert outputs
        assert progress
        assert {r.version for r in outputs} == {loaded}
        assert {r.version for r in progress} == {loaded}

        # The owner edits the code: the engine keeps what it loaded, and says so.
        (folder / "pipeline.py").write_text(VERSIONED + "\n# a 20-minute session gap\n")
        server = a.get("/server")
        assert server["pipeline_version"] == loaded
        assert server["stale"] is True
        assert server["code_on_disk"] == digest(folder) != loaded.split("+")[1]
        wait_for(
            lambda: (
                "twinstream_code_stale{" in a.get_text("/metrics")
                and f'version="{loaded}"' in a.get_text("/metrics")
            ),
            30,
            "the stale code and the version in /metrics",
        )
        stale = [
            line
            for line in a.get_text("/metrics").splitlines()
            if line.startswith("twinstream_code_stale{")
        ]
        assert stale
        assert stale[0].endswith(" 1.0")
    finally:
        p.discard()
