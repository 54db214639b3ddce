"""A real stack (ZooKeeper, three KRaft brokers, Airflow) on its own ports and state folder,
started once per test session through the same code as `make up`, stopped by pid after."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from twinstream.config import Settings, load_settings
from twinstream.stack import core

# Ports apart from the defaults, so a developer's running `make up` stack is left alone.
TEST_ENV = {
    "TWINSTREAM_ZK_PORT": "22181",
    "TWINSTREAM_KAFKA_PORTS": "29092,29093,29094",
    "TWINSTREAM_KAFKA_CONTROLLER_PORTS": "29192,29193,29194",
    "TWINSTREAM_AIRFLOW_PORT": "28080",
    "TWINSTREAM_ENGINE_ADMIN_PORTS": "28701,28702",
    # Non-default retentions prove they come from configuration.
    "TWINSTREAM_INBOUND_RETENTION_MS": str(3 * 24 * 3600 * 1000),
    "TWINSTREAM_OUTBOUND_RETENTION_MS": str(2 * 24 * 3600 * 1000),
    "TWINSTREAM_DLQ_RETENTION_MS": str(5 * 24 * 3600 * 1000),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `stack_teardown` stop the shared stack, so they run after all others."""
    items.sort(key=lambda item: item.get_closest_marker("stack_teardown") is not None)


@pytest.fixture(scope="session")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    env = {**TEST_ENV, "TWINSTREAM_STATE_DIR": str(tmp_path_factory.mktemp("stack"))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def settings(stack_env: dict[str, str]) -> Settings:
    return load_settings()


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[core.UpReport]:
    try:
        report = core.up(settings)
        yield report
    finally:
        core.down(settings)
