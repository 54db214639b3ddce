"""Which code an engine runs: its pipeline's declared version and the digest of its code,
on its GET /server and /metrics and in a header of every record it publishes; a change of
the pipeline's files while it runs is seen, never taken on silently (issue 51, point 1).
A standby on new code beside the active on the old is a shadow: what differs is reported,
and it is neither barred nor restored for it (issue 51, point 3). The deploy that brings
every engine to the new code: tests/integration/test_deploys.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devkit.harness import Pipeline, coverage, wait_for
from tests.integration.versioned import CHANGED, VERSIONED, versioned_package
from twinstream.platform.versions import digest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]


def test_an_engine_says_which_code_it_runs_stamps_its_output_and_sees_a_change_on_disk(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    package, folder = versioned_package(stack_env, VERSIONED)
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


def test_a_standby_on_new_code_is_a_shadow_never_barred_and_may_take_over_exactly_once(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    old, old_folder = versioned_package(stack_env, VERSIONED)
    new, new_folder = versioned_package(stack_env, CHANGED)
    v1, v2 = f"1+{digest(old_folder)}", f"2+{digest(new_folder)}"
    p = Pipeline(stack_env, tmp_path / "pipeline", module=f"{old}.pipeline")
    try:
        a, b = p.start_pair({}, {"TWINSTREAM_PIPELINE_MODULE": f"{new}.pipeline"})
        assert (a.get("/server")["pipeline_version"], b.get("/server")["pipeline_version"]) == (
            v1,
            v2,
        )
        load = p.load(3_000, rate=500)

        def differences() -> dict[str, Any] | None:
            agreement = b.get("/pipeline")["agreement"]
            shadow = agreement.get("shadow") or {}
            return agreement if shadow.get("examples") else None

        agreement = wait_for(differences, 90, "engine b's shadow to report a difference")
        assert agreement["state"] == "shadow"
        shadow = agreement["shadow"]
        assert (shadow["active_version"], shadow["version"]) == (v1, v2)
        assert 0 < shadow["ranges_differing"] <= shadow["ranges_compared"]
        assert shadow["msg_ids_differing"] > 0
        example = shadow["examples"][0]
        assert [r["value"] for r in example["active_rows"]] != [
            r["value"] for r in example["engine_rows"]
        ]
        assert all('"v": 2' in r["value"] for r in example["engine_rows"])
        assert b.role() == "standby"  # never barred: it takes part in the election

        # The old version's engine dies: the new one leads, at a transaction boundary.
        a.kill9()
        wait_for(lambda: b.role() == "active", 30, "engine b, on the new code, active")
        p.join_load(load)
        end = p.produced
        p.wait_published(end - 1)
        missing, duplicated = coverage(p.progress(), end)
        assert (missing, duplicated) == ([], [])
        # One switch per partition: version 1 up to a msg_id, version 2 after it.
        outputs = sorted((r.partition, r.msg_id or 0, r.version) for r in p.outputs())
        for partition in {r[0] for r in outputs}:
            versions = [v for part, _, v in outputs if part == partition]
            switch = versions.index(v2) if v2 in versions else len(versions)
            assert set(versions[:switch]) <= {v1}
            assert set(versions[switch:]) == {v2}
    finally:
        p.discard()
