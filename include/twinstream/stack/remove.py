"""Taking a pipeline off the local stack, with everything it left behind
(`twinstream remove-pipeline NAME [--yes]`).

Guarantee: nothing is stopped, deleted or edited before `confirm` has said yes to a list of
exactly what goes; a refusal or a "no" changes nothing. On yes, in this order: its engines
stop and leave the stack's supervisord (by program name: supervisord stops its own pids);
its Kafka topics (every record in them), its ACLs and SCRAM users (and their passwords in
the credentials file), its ZooKeeper node `/twinstream/<name>` (election, epoch,
quarantine), its engines' folders (checkpoints), its snapshots and its audit reports with
their Data Docs are deleted; then its table leaves the pipelines file and the engines'
Airflow connections are written without it. The file is edited last, so a step that fails
can be finished by running the command again (what is gone already is skipped). The
engines' logs stay, and so does the pipeline's code (`pipelines/<name>/`): it is the
user's, and the last words say where it is and how to delete it. Exit codes: 0 done, 1
refused or declined, 2 an error (the message names the fix).

The pipelines file is edited rather than left to the user: a pipeline's engines, and so its
checkpoints, are named only there; once its table is gone nothing says which folders were
its. The edit removes the table's lines alone (and the comment lines directly above its
header) and is checked by parsing both versions: every other pipeline must read the same,
or nothing is done and the message says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinstream.platform import registry
from twinstream.platform.settings import (
    Connections,
    Settings,
    SettingsError,
)
from twinstream.platform.storage import Location, remove_tree

Echo = Callable[[str], None]
Confirm = Callable[[str], bool]
TIMEOUT_S = 30.0
DONE, REFUSED, ERROR = 0, 1, 2


class RemoveError(Exception):
    """The pipeline cannot be removed as things are; the message says what to do."""


class Refused(RemoveError):
    """Removal refused by policy (exit 1), not an error."""


@dataclass
class Plan:
    """What removing one pipeline will stop and delete (only what exists)."""

    pipeline: Settings
    file: Path
    new_text: str
    removed_text: str
    programs: list[str] = field(default_factory=list)
    absent_programs: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    znode: str | None = None
    znode_children: list[str] = field(default_factory=list)
    folders: list[Location] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    code: KeptCode | None = None

    def describe(self) -> list[str]:
        name = self.pipeline.pipeline
        lines = [f"removing pipeline {name} will:"]
        if self.programs:
            lines.append(f"  stop its engines and drop them from supervisord: {self.programs}")
        if self.absent_programs:
            lines.append(f"  (not programs of the stack's supervisord: {self.absent_programs})")
        if self.topics:
            lines.append(f"  delete its Kafka topics, with every record in them: {self.topics}")
        else:
            lines.append("  (none of its Kafka topics exists)")
        if self.pipeline.kafka_security:
            lines.append(
                f"  delete its Kafka users {self.users} (SCRAM credentials, their passwords "
                f"in {self.pipeline.kafka_credentials_path}) and every ACL granted to them"
            )
        if self.znode:
            children = ", ".join(self.znode_children) or "nothing"
            lines.append(f"  delete ZooKeeper {self.znode} and what is under it ({children})")
        for folder in self.folders:
            lines.append(f"  delete {folder}")
        lines.append(f"  remove its table from {self.file}:")
        lines += [f"    | {line}" for line in self.removed_text.rstrip("\n").splitlines()]
        lines.append(
            f"  keep its engines' logs ({Path(self.pipeline.state_dir) / 'logs'}/engine-*.log)"
        )
        if self.code is not None:
            lines.append(f"  keep its code, {self.code.where}")
        return lines


@dataclass(frozen=True)
class KeptCode:
    """A pipeline's code, which removing it keeps: its module, and the folder (or file)
    that is its alone, when one is below the pipelines file's folder."""

    module: str
    path: Path | None

    @property
    def where(self) -> str:
        return f"module {self.module}" + (f" in {self.path}" if self.path else "")

    def kept(self) -> str:
        if self.path is None:
            return f"Its code ({self.where}) is kept: delete it yourself if you no longer want it."
        rm = "rm -r" if self.path.is_dir() else "rm"
        return (
            f"Its code is kept ({self.path}, module {self.module}): it is yours, delete it "
            f"yourself if you no longer want it (`{rm} {self.path}`)."
        )


def kept_code(listed: dict[str, registry.Entry], name: str) -> KeptCode:
    """Where pipeline `name`'s code is: its package's folder, or its module file's
    (`pipelines/shop/` for `pipelines.shop.pipeline`); the file alone when that folder is
    the pipelines file's own or holds another listed pipeline's code too (a `rm -r` of it
    would delete theirs); no path for a module elsewhere on the path or in a shared
    package."""
    entry = listed[name]
    path = _module_path(entry)
    if path is None:
        return KeptCode(entry.module, None)
    folder = path if path.is_dir() else path.parent
    others = [_module_path(e) for n, e in listed.items() if n != name]
    shared = any(p is not None and p.is_relative_to(folder) for p in others)
    if folder != entry.root.resolve() and not shared:
        return KeptCode(entry.module, folder)
    return KeptCode(entry.module, path if path.is_file() else None)


def _module_path(entry: registry.Entry) -> Path | None:
    """An entry's module (module[:attribute]) below its root: a package's folder, a
    module's file, or None when neither is there."""
    parts = entry.module.partition(":")[0].split(".")
    path = entry.root.resolve().joinpath(*parts)
    if path.is_dir():
        return path
    file = path.with_suffix(".py")
    return file if file.is_file() else None


def remove_pipeline(
    settings: Settings,
    name: str,
    *,
    confirm: Confirm,
    echo: Echo,
    admin: Any = None,
    zk: Any = None,
    supervisor: Any = None,
) -> int:
    """Remove pipeline `name` from the stack `settings` describes (see the module); `admin`
    (a confluent AdminClient as the stack), `zk` (a started KazooClient) and `supervisor`
    (twinstream.stack.supervisor.Supervisor) default to the stack's own."""
    try:
        pipeline, new_text, removed_text = _check(settings, name)
        code = kept_code(registry.entries(settings.pipelines_file), name)
    except RemoveError as exc:
        echo(str(exc))
        return REFUSED if isinstance(exc, Refused) else ERROR
    own_zk = zk is None
    try:
        supervisor = supervisor if supervisor is not None else _supervisor(settings)
        if not supervisor.is_running():
            raise RemoveError(
                f"the stack is not running (state in {settings.state_dir}): start it with "
                "`make up`, then run this again (its engines are stopped here again)"
            )
        admin = admin if admin is not None else _admin(settings)
        if own_zk:
            zk = _zookeeper(settings)
        plan = _plan(settings, pipeline, new_text, removed_text, admin, zk, supervisor)
        plan.code = code
        for line in plan.describe():
            echo(line)
        question = (
            f"remove pipeline {name}: stop its engines and delete everything listed above, "
            "for good?"
        )
        if not confirm(question):
            echo(f"nothing changed: pipeline {name} stays as it was")
            return REFUSED
        _apply(settings, plan, admin, zk, supervisor, echo)
    except RemoveError as exc:
        echo(str(exc))
        return ERROR
    except Exception as exc:  # Kafka, ZooKeeper, storage: say what is left and the fix
        echo(
            f"removing pipeline {name} failed: {type(exc).__name__}: {exc}. Its table is "
            f"still in {settings.pipelines_file}: check the stack (`make status`) and run "
            "this again to finish; what is gone already is skipped"
        )
        return ERROR
    finally:
        if own_zk and zk is not None:
            zk.stop()
            zk.close()
    echo(
        f"pipeline {name} removed; `make up` now runs the stack without it (and changes "
        f"nothing else). {code.kept()}"
    )
    return DONE


def _check(settings: Settings, name: str) -> tuple[Settings, str, str]:
    """The pipeline's settings and the pipelines file without and with only its table."""
    if settings.pipeline_module:
        raise RemoveError(
            "TWINSTREAM_PIPELINE_MODULE runs one pipeline outside the pipelines file: unset it "
            f"to remove a pipeline of {settings.pipelines_file}"
        )
    path = settings.pipelines_file
    try:
        listed = registry.entries(path)
        registry.stack(settings)
    except SettingsError as exc:
        raise RemoveError(f"{exc}; fix the pipelines file first") from None
    if name not in listed:
        raise RemoveError(
            f"pipeline {name!r} is not in {path} (it lists {', '.join(listed) or 'none'}): "
            "nothing to remove. If you deleted its table already, put it back (its module, "
            "engines and admin_ports) and run this again: only the table says which engines, "
            "and so which checkpoints, were its"
        )
    if name == settings.pipeline:
        others = [n for n in listed if n != name]
        raise Refused(
            f"{name} is TWINSTREAM_PIPELINE, the pipeline every command and DAG defaults to: "
            + (
                f"set TWINSTREAM_PIPELINE to another one ({', '.join(others)}) for this "
                "command and for `make up`, then run this again"
                if others
                else "it is the only pipeline; add another first, or delete the stack "
                "(`make clean`)"
            )
        )
    if name in settings.stack_pipelines:
        raise Refused(
            f"TWINSTREAM_STACK_PIPELINES names {name}: take it out of that variable first"
        )
    text = path.read_text()
    new_text, removed = without_table(text, name)
    before = tomllib.loads(text)
    try:
        after = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError:
        after = None
    if after != {k: v for k, v in before.items() if k != name}:
        raise RemoveError(
            f"cannot take [{name}] out of {path} line by line (it is not one `[{name}]` header "
            "followed by its keys): write it so, then run this again"
        )
    return registry.settings_for(settings, name), new_text, removed


_TABLE = re.compile(r"^\s*\[")


def without_table(text: str, name: str) -> tuple[str, str]:
    """`text` (TOML) without table [name]: its header, its lines up to the next table
    (comments and blank lines just before that one stay with it) and the comment lines
    directly above its header. Returns (new text, what was taken out); the caller checks
    the result parses as the same file without that table."""
    quoted = re.escape(name)
    header = re.compile(rf"""^\s*\[\s*(?:{quoted}|"{quoted}"|'{quoted}')\s*\]\s*(?:#.*)?$""")
    lines = text.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if header.match(line)]
    if len(found) != 1:
        return text, ""
    start = end = found[0]
    end += 1
    while end < len(lines) and not _TABLE.match(lines[end]):
        end += 1
    # What precedes the next table (its comments, blank lines) is not this table's.
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip()[0] == "#"):
        end -= 1
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    before, removed, after = lines[:start], lines[start:end], lines[end:]
    # One blank line where the table was, none at the end of the file.
    while after and not after[0].strip() and (not before or not before[-1].strip()):
        after.pop(0)
    if not "".join(after).strip():
        while before and not before[-1].strip():
            before.pop()
        after = []
    return "".join(before + after), "".join(removed)


def _supervisor(settings: Connections) -> Any:
    from twinstream.stack.layout import Layout
    from twinstream.stack.supervisor import Supervisor

    return Supervisor(Layout.of(settings))


def _admin(settings: Settings) -> Any:
    from confluent_kafka.admin import AdminClient

    from twinstream.stack.tls import kafka_superuser_config

    return AdminClient(kafka_superuser_config(settings))


def _zookeeper(settings: Connections) -> Any:
    from twinstream.core.election import zk_client

    # A command, not an engine: give up after a few tries instead of retrying forever.
    client = zk_client(settings.zookeeper(), connection_retry={"max_tries": 3, "delay": 0.5})
    try:
        client.start(timeout=15)
    except Exception as exc:
        raise RemoveError(
            f"ZooKeeper at {settings.zk_hosts} does not answer ({exc}): is the stack up "
            "(`make status`)?"
        ) from None
    return client


def _plan(
    settings: Connections,
    pipeline: Settings,
    new_text: str,
    removed_text: str,
    admin: Any,
    zk: Any,
    supervisor: Any,
) -> Plan:
    from twinstream.core.election import ROOT
    from twinstream.platform.kafka_auth import ROLES, user_name

    plan = Plan(pipeline, settings.pipelines_file, new_text, removed_text)
    running = {p.name for p in supervisor.processes()}
    for engine_id in pipeline.engine_ids:
        program = f"engine-{engine_id}"
        (plan.programs if program in running else plan.absent_programs).append(program)
    existing = set(admin.list_topics(timeout=TIMEOUT_S).topics)
    wanted = [
        pipeline.inbound_topic,
        pipeline.outbound_topic,
        pipeline.dlq_topic,
        pipeline.progress_topic,
    ]
    plan.topics = [t for t in wanted if t in existing]
    node = f"{ROOT}/{pipeline.pipeline}"
    if zk.exists(node):
        plan.znode = node
        plan.znode_children = sorted(zk.get_children(node))
    folders: list[Location] = []
    for engine_id in pipeline.engine_ids:
        # The engine's folder holds its local checkpoint and warm-up; a checkpoint on shared
        # storage (checkpoint_root) is named by pipeline and engine.
        folders.append(pipeline.engine_dir(engine_id))
        if pipeline.checkpoint_root:
            folders.append(pipeline.checkpoint_dir(engine_id))
    folders += [pipeline.snapshot_dir, pipeline.audit_dir]
    plan.folders = [f for f in folders if f.exists()]
    if pipeline.kafka_security:
        plan.users = [user_name(pipeline.pipeline, role) for role in ROLES]
    return plan


def _apply(
    settings: Settings, plan: Plan, admin: Any, zk: Any, supervisor: Any, echo: Echo
) -> None:
    pipeline = plan.pipeline
    for program in plan.programs:
        supervisor.remove(program)
        echo(f"  stopped {program} and dropped it from supervisord")
    if plan.topics:
        for topic, future in admin.delete_topics(
            plan.topics, operation_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S
        ).items():
            _result(future, "UNKNOWN_TOPIC_OR_PART")
            echo(f"  deleted topic {topic}")
    if pipeline.kafka_security:
        _remove_users(pipeline, plan.users, admin, echo)
    if plan.znode:
        from kazoo.exceptions import NoNodeError

        with contextlib.suppress(NoNodeError):
            zk.delete(plan.znode, recursive=True)
        echo(f"  deleted ZooKeeper {plan.znode}")
    for folder in plan.folders:
        remove_tree(folder)
        echo(f"  deleted {folder}")
    _replace_text(plan.file, plan.new_text)
    echo(f"  removed [{pipeline.pipeline}] from {plan.file}")
    _rewrite_connections(settings, echo)


def _remove_users(pipeline: Connections, users: list[str], admin: Any, echo: Echo) -> None:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
        ScramMechanism,
        UserScramCredentialDeletion,
    )

    from twinstream.platform.kafka_auth import Credentials, principal

    # Every ACL naming one of its users, whatever the resource: the pipeline's own
    # (kafka_auth.acl_bindings) and any read of another topic granted since (grant_read).
    # None matches any name and any host; the library's types say str only.
    anything: Any = None
    filters = [
        AclBindingFilter(
            ResourceType.ANY,
            anything,
            ResourcePatternType.ANY,
            principal(user),
            anything,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        for user in users
    ]
    deleted = 0
    for future in admin.delete_acls(filters, request_timeout=TIMEOUT_S).values():
        deleted += len(future.result(timeout=TIMEOUT_S) or [])
    echo(f"  deleted {deleted} ACLs of {', '.join(users)}")
    deletions = [UserScramCredentialDeletion(u, ScramMechanism.SCRAM_SHA_512) for u in users]
    for user, future in admin.alter_user_scram_credentials(deletions).items():
        # A user Kafka never knew (a stack without it yet) is already gone.
        _result(future, "RESOURCE_NOT_FOUND")
        echo(f"  deleted Kafka user {user}")
    path = pipeline.kafka_credentials_path
    if path.exists():
        creds = Credentials.load(path)
        if any(u in creds.passwords for u in users):
            for user in users:
                creds.passwords.pop(user, None)
            creds.save()
            echo(f"  deleted their passwords from {path}")


def _result(future: Any, gone: str) -> None:
    """Wait for a Kafka admin future; an error named `gone` means already done."""
    from confluent_kafka import KafkaException

    try:
        future.result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if getattr(error, "name", lambda: "")() != gone:
            raise


def _replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, keeping the file's permissions."""
    mode = path.stat().st_mode & 0o7777
    tmp = path.with_name(f".{path.name}.remove-pipeline.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def _rewrite_connections(settings: Settings, echo: Echo) -> None:
    """The engines' Airflow connections without the removed ones (as `up` writes them)."""
    from twinstream.stack import render
    from twinstream.stack.core import write_if_changed
    from twinstream.stack.layout import Layout

    path = Layout.of(settings).airflow_connections
    if path.exists() and write_if_changed(path, render.airflow_connections(settings), private=True):
        echo(f"  rewrote Airflow's engine connections ({path})")
