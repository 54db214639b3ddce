"""The rules every DAG in dags/ follows (Airflow best practices, this repo's brief)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any


def dag_problems(dag: Any, path: Path) -> list[str]:
    problems = []
    name = dag.dag_id
    if name != path.stem:
        problems.append(f"{name}: dag_id differs from the file name {path.name}")
    if not dag.tags:
        problems.append(f"{name}: no tags")
    if not (dag.doc_md or "").strip():
        problems.append(f"{name}: no doc_md (the module docstring)")
    if dag.catchup is not False:
        problems.append(f"{name}: catchup must be False")
    for task in dag.tasks:
        if task.owner in (None, "", "airflow"):
            problems.append(f"{name}.{task.task_id}: no owner")
        if not task.retries or task.retries < 1:
            problems.append(f"{name}.{task.task_id}: retries must be at least 1")
    # Defaults differ between Airflow versions and configs: say it in the file.
    for keyword in sorted({"schedule", "catchup"} - _dag_keywords(path)):
        problems.append(f"{name}: {keyword} must be passed explicitly to @dag")
    return problems


def _dag_keywords(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called in ("dag", "DAG"):
                return {k.arg for k in node.keywords if k.arg}
    return set()
