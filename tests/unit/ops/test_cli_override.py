"""`twinstream override ENGINE`: the one way, besides the admin API, to let an engine that
disagrees with the active lead (the admin client's answers faked)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakes import pipeline_info
from twinstream.engine.api import AgreementInfo, Difference, PipelineInfo
from twinstream.engine.client import EngineClient, EngineError
from twinstream.ops import cli


class FakeClient:
    def __init__(self, engine_id: str, answer: PipelineInfo | EngineError) -> None:
        self.engine_id = engine_id
        self.answer = answer
        self.calls: list[str] = []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *_exc: object) -> None: ...

    def override(self) -> PipelineInfo:
        self.calls.append("override")
        if isinstance(self.answer, EngineError):
            raise self.answer
        return self.answer


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path) -> dict[str, Any]:
    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("TWINSTREAM_ADMIN_TOKEN", "t")
    made: dict[str, Any] = {}

    def from_settings(_cls: type, settings: Any, engine_id: str, token: str) -> FakeClient:
        client = FakeClient(engine_id, made["answer"])
        made["client"] = client
        return client

    monkeypatch.setattr(EngineClient, "from_settings", classmethod(from_settings))
    return made


def test_override_lets_a_disagreeing_engine_lead_and_says_where_it_differs(engine, capsys):
    difference = Difference(partition=0, msg_id=999, first=950, last=1040, epoch=3)
    engine["answer"] = pipeline_info(
        agreement=AgreementInfo(state="disagrees", difference=difference, overridden=True)
    )
    assert cli.main(["override", "b"]) == 0
    assert engine["client"].calls == ["override"]
    out = capsys.readouterr().out
    assert "engine b of pipeline hostmetrics may lead although it disagrees" in out
    assert "msg_id 999 (the active's transaction of msg_id 950..1040, epoch 3)" in out
    assert "restore it (restore_and_resync, snapshot proven)" in out


def test_override_of_an_engine_that_agrees_is_refused_with_its_reason(engine, capsys):
    engine["answer"] = EngineError(
        "a", "POST /pipeline/override", 409, "this engine does not disagree with the active"
    )
    assert cli.main(["override", "a"]) == 1
    assert "engine a: this engine does not disagree" in capsys.readouterr().err


def test_override_of_an_unknown_engine_names_the_known_ones(engine, capsys):
    assert cli.main(["override", "zz"]) == 2
    assert "no pipeline of this stack runs engine 'zz'" in capsys.readouterr().err
