"""twinstream.stack.remove with fakes of Kafka's admin client, kazoo and supervisord: what
removing a pipeline deletes (its engines, topics, users, ACLs, znode, folders, table), that
a "no" or a refusal deletes nothing, and the pipelines file edit that keeps the rest."""

from __future__ import annotations

import json
import tomllib
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from twinstream.platform.kafka_auth import Credentials
from twinstream.platform.settings import Settings, load_settings
from twinstream.stack import render
from twinstream.stack.layout import Layout
from twinstream.stack.remove import remove_pipeline, without_table
from twinstream.stack.supervisor import ProcessInfo

FILE = """# The pipelines.
# Second line of the file's comment.

[hostmetrics]
module = "pipelines.hostmetrics.pipeline"
partitions = 3

# Payments: c and d.
[payments]
module = "pipelines.payments.pipeline"
engines = ["c", "d"]
admin_ports = [8703, 8704]

# The shop's own comment.
[shop]
module = "shop.pipeline"
engines = ["e", "f"]
admin_ports = [8705, 8706]
"""


def _done(value: Any = None) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class FakeAdmin:
    def __init__(self, topics: set[str]) -> None:
        self.topics = set(topics)
        self.deleted_topics: list[str] = []
        self.deleted_acls: list[Any] = []
        self.deleted_users: list[str] = []

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={t: object() for t in self.topics})

    def delete_topics(self, topics: list[str], **_timeouts: float) -> dict[str, Future[Any]]:
        self.deleted_topics += topics
        self.topics -= set(topics)
        return {t: _done() for t in topics}

    def delete_acls(self, filters: list[Any], request_timeout: float) -> dict[Any, Future[Any]]:
        self.deleted_acls += filters
        return {f: _done([f]) for f in filters}

    def alter_user_scram_credentials(self, alterations: list[Any]) -> dict[str, Future[Any]]:
        self.deleted_users += [a.user for a in alterations]
        return {a.user: _done() for a in alterations}


class FakeZk:
    def __init__(self, nodes: dict[str, list[str]]) -> None:
        self.nodes = nodes
        self.deleted: list[str] = []

    def exists(self, path: str) -> bool:
        return path in self.nodes

    def get_children(self, path: str) -> list[str]:
        return self.nodes[path]

    def delete(self, path: str, recursive: bool = False) -> None:
        assert recursive
        self.deleted.append(path)
        self.nodes.pop(path)


class FakeSupervisor:
    def __init__(self, programs: list[str], running: bool = True) -> None:
        self.programs = programs
        self.running = running
        self.removed: list[str] = []

    def is_running(self) -> bool:
        return self.running

    def processes(self) -> list[ProcessInfo]:
        return [ProcessInfo(p, p, "RUNNING", 100 + i, "") for i, p in enumerate(self.programs)]

    def remove(self, name: str) -> None:
        self.removed.append(name)
        self.programs.remove(name)


SHOP_TOPICS = {"shop.in", "shop.out", "shop.dlq", "shop.progress"}
SHOP_USERS = ["shop-engine", "shop-publisher", "shop-reader"]


@pytest.fixture
def stack(tmp_path: Path) -> SimpleNamespace:
    path = tmp_path / "pipelines.toml"
    path.write_text(FILE)
    path.chmod(0o640)
    settings = load_settings(
        state_dir=tmp_path, pipelines_file=path, admin_token="tok", kafka_security=True
    )
    shop = [
        tmp_path / "engines" / "e" / "checkpoint" / "offsets" / "0",
        tmp_path / "engines" / "f" / "checkpoint" / "commits" / "0",
        tmp_path / "snapshots" / "shop" / "snap-1" / "manifest.json",
        tmp_path / "audit" / "shop" / "gx" / "index.html",
    ]
    others = [
        tmp_path / "engines" / "c" / "checkpoint" / "offsets" / "0",
        tmp_path / "snapshots" / "payments" / "snap-1" / "manifest.json",
        tmp_path / "audit" / "payments" / "cursor.json",
    ]
    for file in shop + others:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("x")
    Credentials.ensure(
        settings.kafka_credentials_path,
        ["twinstream-admin", "payments-engine", *SHOP_USERS],
    )
    connections = Layout.of(settings).airflow_connections
    connections.parent.mkdir(parents=True)
    connections.write_text(render.airflow_connections(settings))
    engines = [f"engine-{e}" for e in "abcdef"]
    return SimpleNamespace(
        settings=settings,
        path=path,
        shop=shop,
        others=others,
        admin=FakeAdmin(SHOP_TOPICS | {"payments.in", "hostmetrics.in"}),
        zk=FakeZk({"/twinstream/shop": ["election", "epoch"], "/twinstream/payments": []}),
        supervisor=FakeSupervisor(engines),
        connections=connections,
    )


def _remove(
    stack: SimpleNamespace, name: str, answer: bool, settings: Settings | None = None
) -> tuple[int, list[str], list[str]]:
    questions: list[str] = []
    lines: list[str] = []

    def confirm(question: str) -> bool:
        questions.append(question)
        return answer

    code = remove_pipeline(
        settings or stack.settings,
        name,
        confirm=confirm,
        echo=lines.append,
        admin=stack.admin,
        zk=stack.zk,
        supervisor=stack.supervisor,
    )
    return code, questions, lines


def test_yes_deletes_the_pipelines_engines_topics_users_znode_folders_and_table(stack):
    code, questions, lines = _remove(stack, "shop", True)
    out = "\n".join(lines)
    assert code == 0, out
    assert len(questions) == 1
    assert "shop" in questions[0]
    # What it said it would delete, before anything was deleted.
    plan = out.split("  stopped engine-e")[0]
    for thing in [*sorted(SHOP_TOPICS), *SHOP_USERS, "/twinstream/shop", "engine-e"]:
        assert thing in plan, thing
    for folder in ("engines/e", "engines/f", "snapshots/shop", "audit/shop"):
        assert str(stack.settings.state_dir / folder) in plan, folder
    assert stack.supervisor.removed == ["engine-e", "engine-f"]
    assert sorted(stack.admin.deleted_topics) == sorted(SHOP_TOPICS)
    assert stack.admin.topics == {"payments.in", "hostmetrics.in"}
    assert sorted(stack.admin.deleted_users) == SHOP_USERS
    principals = {f.principal for f in stack.admin.deleted_acls}
    assert principals == {f"User:{u}" for u in ("shop-engine", "shop-publisher", "shop-reader")}
    assert stack.zk.deleted == ["/twinstream/shop"]
    assert "/twinstream/payments" in stack.zk.nodes
    assert not any(f.exists() for f in stack.shop)
    assert not (stack.settings.state_dir / "engines" / "e").exists()
    assert all(f.exists() for f in stack.others)
    passwords = Credentials.load(stack.settings.kafka_credentials_path).passwords
    assert set(passwords) == {"twinstream-admin", "payments-engine"}
    # The table alone left the file; its mode is kept; the other pipelines read the same.
    left = stack.path.read_text()
    assert tomllib.loads(left) == {k: v for k, v in tomllib.loads(FILE).items() if k != "shop"}
    assert "# The shop's own comment." not in left  # directly above its header
    assert "# Payments: c and d." in left
    assert stack.path.stat().st_mode & 0o777 == 0o640
    conns = json.loads(stack.connections.read_text())
    assert "twinstream_engine_e" not in conns
    assert "twinstream_engine_c" in conns
    assert stack.connections.stat().st_mode & 0o777 == 0o600


def test_no_deletes_nothing_and_edits_nothing(stack):
    connections = stack.connections.read_text()
    code, questions, lines = _remove(stack, "shop", False)
    assert code == 1
    assert questions
    assert "nothing changed" in lines[-1]
    assert stack.supervisor.removed == []
    assert stack.admin.deleted_topics == stack.admin.deleted_acls == []
    assert stack.admin.deleted_users == []
    assert stack.zk.deleted == []
    assert all(f.exists() for f in stack.shop)
    assert stack.path.read_text() == FILE
    assert stack.connections.read_text() == connections
    assert "shop-engine" in Credentials.load(stack.settings.kafka_credentials_path).passwords


@pytest.mark.parametrize(
    ("name", "overrides", "code", "says"),
    [
        ("nope", {}, 2, "is not in"),
        ("hostmetrics", {"pipeline": "hostmetrics"}, 1, "TWINSTREAM_PIPELINE"),
        ("shop", {"stack_pipelines": ["hostmetrics", "shop"]}, 1, "TWINSTREAM_STACK_PIPELINES"),
    ],
)
def test_refusals_ask_nothing_and_delete_nothing(stack, name, overrides, code, says):
    settings = stack.settings.model_copy(update=overrides)
    got, questions, lines = _remove(stack, name, True, settings)
    assert got == code
    assert says in lines[-1]
    assert questions == []
    assert stack.supervisor.removed == stack.admin.deleted_topics == stack.zk.deleted == []
    assert stack.path.read_text() == FILE


def test_a_stack_that_is_not_running_is_an_error_that_says_to_start_it(stack):
    stack.supervisor.running = False
    code, questions, lines = _remove(stack, "shop", True)
    assert code == 2
    assert "make up" in lines[-1]
    assert questions == []
    assert stack.path.read_text() == FILE


def test_a_failure_half_way_leaves_the_table_so_that_a_second_run_finishes(stack):
    def fail(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("ZooKeeper went away")

    stack.zk.delete = fail
    code, _, lines = _remove(stack, "shop", True)
    assert code == 2
    assert "run this again" in lines[-1]
    assert "[shop]" in stack.path.read_text()
    stack.zk.delete = FakeZk.delete.__get__(stack.zk)
    code, _, lines = _remove(stack, "shop", True)
    assert code == 0, lines
    assert "[shop]" not in stack.path.read_text()
    assert "/twinstream/shop" not in stack.zk.nodes


def test_a_table_that_cannot_be_taken_out_line_by_line_is_refused_before_anything(stack):
    # The entry as an inline table, not a [shop] section: no lines to take out, so nothing
    # is done and the message says how to write it.
    shop = FILE.index("# The shop's own comment.")
    text = (
        'shop = { module = "shop.pipeline", engines = ["e", "f"], admin_ports = [8705, 8706] }\n'
        + FILE[:shop]
    )
    stack.path.write_text(text)
    code, questions, lines = _remove(stack, "shop", True)
    assert (code, questions) == (2, [])
    assert "line by line" in lines[-1]
    assert stack.path.read_text() == text
    assert stack.admin.deleted_topics == []


@pytest.mark.parametrize(
    ("text", "name", "left"),
    [
        ("[a]\nm = 1\n\n[b]\nm = 2\n", "a", "[b]\nm = 2\n"),
        ("[a]\nm = 1\n\n[b]\nm = 2\n", "b", "[a]\nm = 1\n"),
        ("# top\n\n[a]\nm = 1\n\n# about b\n[b]\nm = 2\n", "a", "# top\n\n# about b\n[b]\nm = 2\n"),
        (
            '[a]\nm = 1\n\n["b"]  # quoted\nm = [\n  1,\n]\n\n[c]\nm = 3\n',
            "b",
            "[a]\nm = 1\n\n[c]\nm = 3\n",
        ),
    ],
)
def test_without_table_takes_the_table_alone(text, name, left):
    new, removed = without_table(text, name)
    assert new == left
    assert tomllib.loads(new) == {k: v for k, v in tomllib.loads(text).items() if k != name}
    assert removed.strip()


def test_without_kafka_security_there_are_no_users_or_acls_to_delete(stack):
    settings = stack.settings.model_copy(update={"kafka_security": False})
    code, _, lines = _remove(stack, "shop", True, settings)
    assert code == 0, lines
    assert stack.admin.deleted_users == stack.admin.deleted_acls == []
    assert sorted(stack.admin.deleted_topics) == sorted(SHOP_TOPICS)


def _code(root: Path, module: str) -> Path:
    """A module's file below the pipelines file's folder, as new-pipeline writes one."""
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("pipeline = None\n")
    return path


def test_the_pipelines_code_is_kept_and_the_last_words_say_where_and_how_to_delete_it(stack):
    code = _code(stack.path.parent, "shop.pipeline")
    status, _questions, lines = _remove(stack, "shop", True)
    assert status == 0
    folder = code.parent.resolve()
    assert f"  keep its code, module shop.pipeline in {folder}" in lines
    assert lines[-1].endswith(
        f"Its code is kept ({folder}, module shop.pipeline): it is yours, delete it yourself "
        f"if you no longer want it (`rm -r {folder}`)."
    )
    assert code.exists()


def test_a_folder_with_another_pipelines_code_is_not_offered_for_rm_r(tmp_path):
    from twinstream.platform import registry
    from twinstream.stack.remove import kept_code

    path = tmp_path / "pipelines.toml"
    path.write_text(
        '[shop]\nmodule = "pipelines.shop"\n\n[bank]\nmodule = "pipelines.bank:pipeline"\n'
        '\n[own]\nmodule = "pipelines.own.pipeline"\n\n[top]\nmodule = "top"\n'
    )
    for module in ("pipelines.shop", "pipelines.bank", "pipelines.own.pipeline", "top"):
        _code(tmp_path, module)
    listed = registry.entries(path)
    root = tmp_path.resolve()
    # Two pipelines of one folder: each its own file, never the folder.
    assert kept_code(listed, "shop").path == root / "pipelines" / "shop.py"
    assert kept_code(listed, "bank").path == root / "pipelines" / "bank.py"
    assert kept_code(listed, "own").path == root / "pipelines" / "own"
    # Beside the pipelines file: the file, not the folder of everything.
    assert kept_code(listed, "top").path == root / "top.py"
    assert kept_code(listed, "top").kept().endswith(f"(`rm {root / 'top.py'}`).")
    # Not below the pipelines file (on PYTHONPATH): its module named, no path to delete.
    (root / "top.py").unlink()
    gone = kept_code(registry.entries(path), "top")
    assert gone.path is None
    assert (
        gone.kept() == "Its code (module top) is kept: delete it yourself if you no longer want it."
    )
