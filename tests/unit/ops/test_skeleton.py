"""The pipeline `twinstream new-pipeline` writes is a Keyed one whose step keeps the
contract, checked without Spark: its own plain-Python test passes in this process (the
Spark half runs in tests/integration/test_new_pipeline.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from twinstream.contract import Keyed, Pipeline
from twinstream.ops import skeleton
from twinstream.testing import keyed


def test_the_skeleton_is_keyed_and_its_step_keeps_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skeleton.write("shop_totals_unit", tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("shop_totals_unit.pipeline")
        tests = importlib.import_module("shop_totals_unit.test_pipeline")
        pipeline = module.pipeline
        assert isinstance(pipeline, Pipeline)
        # The skeleton teaches the keyed path, not a DataFrame transform.
        assert isinstance(pipeline.keyed, Keyed)
        assert pipeline.transform is None
        assert pipeline.partition_by == "key"
        tests.test_the_step_counts_forgets_idle_keys_and_rejects_an_overflow()
        # Many keys interleaved: one batch and one batch per record agree, and each key's
        # count is its number of non-zero amounts.
        records = [
            {"msg_id": i, "key": f"k{i % 7}", "amount": float(i % 4), "ts_ms": i}
            for i in range(200)
        ]
        one = keyed.run(pipeline, records)
        assert one == keyed.run(pipeline, records, batches=200)
        counts = {key: state[0] for key, state in one.states[0].items()}
        assert counts == {
            f"k{k}": sum(1 for i in range(200) if i % 7 == k and i % 4) for k in range(7)
        }
    finally:
        # The package lives in tmp_path: leave no module of it behind for other tests.
        for name in [m for m in sys.modules if m.startswith("shop_totals_unit")]:
            sys.modules.pop(name, None)


def test_the_printed_entrys_publishers_line_says_what_it_is_and_runs_nothing_as_printed(
    tmp_path: Path,
) -> None:
    import tomllib

    from twinstream.platform import registry

    text = skeleton.pipelines_entry("shop", [("e", 8705), ("f", 8706)])
    line = next(line for line in text.splitlines() if line.startswith("publishers"))
    # The programs run in the stack's state folder: a relative source would be read there.
    source = tomllib.loads(text)["shop"]["publishers"]["source"]
    assert Path(source).is_absolute()
    comment = line.split("  # ", 1)[1]
    assert "optional, none as it is" in comment
    assert "publisher adapters following it into shop.in" in comment
    path = tmp_path / "pipelines.toml"
    path.write_text(text)
    assert registry.entries(path)["shop"].publishers is None
