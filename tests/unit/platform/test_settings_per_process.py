"""Each process reads and validates only its own groups of settings, and no product function
takes the whole `Settings` to read a few of its fields (issue 50, point 2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from twinstream.platform.settings import (
    REPO_ROOT,
    AdapterSettings,
    EngineSettings,
    Settings,
    SettingsError,
    StackLayout,
    TaskSettings,
    load,
    load_settings,
)

PRODUCT = [REPO_ROOT / d for d in ("include", "dags", "plugins", "spark_jobs")]


def test_a_stack_only_variable_never_stops_an_engine_a_task_or_an_adapter(monkeypatch):
    monkeypatch.setenv("TWINSTREAM_AIRFLOW_PORT", "banana")
    monkeypatch.setenv("TWINSTREAM_ZK_HEAP", "lots")
    for kind in (EngineSettings, TaskSettings, AdapterSettings):
        assert load(kind).zk_port == 2181
    with pytest.raises(SettingsError, match="TWINSTREAM_AIRFLOW_PORT"):
        load_settings()


def test_an_engine_only_variable_never_stops_a_task_or_an_adapter(monkeypatch):
    monkeypatch.setenv("TWINSTREAM_MAX_BATCH_S", "-1")
    for reader in (TaskSettings, AdapterSettings):
        load(reader)
    for engine in (EngineSettings, Settings):
        with pytest.raises(SettingsError, match="TWINSTREAM_MAX_BATCH_S"):
            load(engine)


def test_each_process_holds_only_its_groups():
    stack_only = set(StackLayout.model_fields)
    for kind in (EngineSettings, TaskSettings, AdapterSettings):
        assert not stack_only & set(kind.model_fields), kind.__name__
    assert "max_batch_s" not in TaskSettings.model_fields
    assert "persist_interval_s" not in EngineSettings.model_fields
    assert set(AdapterSettings.model_fields) < set(TaskSettings.model_fields)
    # The stack and the CLI start every other process: they read every group.
    for kind in (EngineSettings, TaskSettings, AdapterSettings):
        assert issubclass(Settings, kind)


@pytest.mark.parametrize(
    ("entry", "kind"),
    [
        ("spark_jobs/engine.py", "EngineSettings"),
        ("spark_jobs/audit_output.py", "TaskSettings"),
        *((f"dags/{p.name}", "TaskSettings") for p in sorted((REPO_ROOT / "dags").glob("*.py"))),
    ],
)
def test_each_process_edge_loads_its_own_kind(entry, kind):
    text = (REPO_ROOT / entry).read_text()
    assert "load_settings(" not in text, f"{entry} loads the stack's whole Settings"
    if "load(" in text:
        assert f"load({kind})" in text


def _whole_settings_for_a_few_fields() -> list[str]:
    """Product functions with a parameter of the whole `Settings` that read three fields of
    it or fewer and hand it to nothing else."""
    found = []
    for root in PRODUCT:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                for param in params:
                    annotation = param.annotation
                    if not (isinstance(annotation, ast.Name) and annotation.id == "Settings"):
                        continue
                    read = {
                        n.attr
                        for n in ast.walk(node)
                        if isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name)
                        and n.value.id == param.arg
                    }
                    handed = any(
                        isinstance(arg, ast.Name) and arg.id == param.arg
                        for call in ast.walk(node)
                        if isinstance(call, ast.Call)
                        for arg in [*call.args, *(k.value for k in call.keywords)]
                    )
                    if len(read) <= 3 and not handed:
                        where = path.relative_to(REPO_ROOT)
                        found.append(
                            f"{where}:{node.lineno} {node.name}({param.arg}) reads {sorted(read)}"
                        )
    return found


def test_no_product_function_takes_the_whole_settings_to_read_a_few_fields():
    assert _whole_settings_for_a_few_fields() == []


def test_the_rule_finds_a_function_that_would_break_it(tmp_path: Path, monkeypatch):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "m.py").write_text(
        "def port(settings: Settings) -> int:\n    return settings.airflow_port\n"
    )
    monkeypatch.setattr(f"{__name__}.PRODUCT", [tmp_path / "include"])
    monkeypatch.setattr(f"{__name__}.REPO_ROOT", tmp_path)
    assert _whole_settings_for_a_few_fields() == [
        "include/m.py:1 port(settings) reads ['airflow_port']"
    ]
