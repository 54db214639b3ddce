"""The CLI around other modules' work: `remove-pipeline` (twinstream.stack.remove) asks
before it removes anything, and refuses rather than asks when no one can answer;
`new-pipeline` prints the pipelines-file entry twinstream.ops.skeleton makes."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from twinstream.ops import cli, skeleton
from twinstream.platform.settings import Settings


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


QUESTION = "remove pipeline p: stop its engines and delete everything listed above, for good?"


def test_yes_answers_without_asking(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.confirmer(True, io.StringIO(""))(QUESTION) is True
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("typed", "answer"), [("y\n", True), ("yes\n", True), ("n\n", False)])
def test_a_terminal_is_asked(typed: str, answer: bool, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.confirmer(False, Terminal(typed))(QUESTION) is answer
    assert capsys.readouterr().err == f"{QUESTION} [y/N] "


def test_nothing_typed_is_no(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.confirmer(False, Terminal(""))(QUESTION) is False


def test_without_a_terminal_the_answer_is_no_and_says_to_pass_yes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.confirmer(False, io.StringIO("y\n"))(QUESTION) is False
    err = capsys.readouterr().err
    assert "standard input is not a terminal" in err
    assert "--yes" in err


def test_remove_pipeline_passes_the_name_and_the_answer_and_returns_its_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import twinstream.stack.remove as remove

    seen: dict[str, Any] = {}

    def fake(
        settings: Settings,
        name: str,
        *,
        confirm: Callable[[str], bool],
        echo: Callable[[str], None],
    ) -> int:
        seen.update(name=name, answer=confirm(QUESTION), pipeline=settings.pipeline)
        return 7

    monkeypatch.setattr(remove, "remove_pipeline", fake)
    assert cli.main(["remove-pipeline", "payments", "--yes"]) == 7
    # The stack's settings, no pipeline chosen: remove-pipeline names its own.
    assert seen == {"name": "payments", "answer": True, "pipeline": ""}


def test_new_pipeline_prints_the_entry_the_skeleton_makes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offered: list[Sequence[tuple[str, int]]] = []

    def entry(name: str, free: Sequence[tuple[str, int]], package: str = "") -> str:
        offered.append(free)
        return f"[{name}]\nmodule = 'from-the-skeleton'\n"

    # raising=False: the function may not be in skeleton.py yet (another change adds it).
    monkeypatch.setattr(skeleton, "pipelines_entry", entry, raising=False)
    assert cli.main(["new-pipeline", "clicks", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\n[clicks]\nmodule = 'from-the-skeleton'\n\nand `make up`" in out
    assert len(offered) == 1
    assert offered[0]  # the stack's free engine ids and ports
