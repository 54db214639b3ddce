"""Twinstream in the Airflow UI: a "Twinstream" entry in the navigation opens the operator's
page (every pipeline's engines, publisher adapters, takeovers, snapshots, latest audit and
its Data Docs, with buttons that trigger the operating DAGs), served by the API server at
/twinstream/.

This file only wires: the page is `twinstream.ops.operator_ui.app`, its facts come from
`twinstream.ops.overview`. Importing it does no network work (the plugin manager test checks):
the engines are read when the page asks, through the connections `twinstream_engine_<id>`
(their admin APIs, tokens as passwords): the local stack's from the connections file `up`
rewrites (Airflow's LocalFilesystemBackend reads it at every lookup), compose's from
`AIRFLOW_CONN_TWINSTREAM_ENGINE_<ID>`. The publisher adapters are read from their status
nodes in ZooKeeper (connected on the page's first request, with the stack's ZooKeeper
settings). The pipelines file is read again when it changes, so a pipeline `up` adds appears
on the page without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.api_fastapi.core_api.security import requires_authenticated
from airflow.plugins_manager import AirflowPlugin

from twinstream.engine.client import EngineClient
from twinstream.ops.operator_ui.app import PREFIX, Sources, create_app
from twinstream.ops.overview import AdapterReader
from twinstream.platform.settings import CommonSettings, Connections


def _connection(conn_id: str) -> Any:
    # The API server is no task: it reads connections from the secrets backends directly.
    from airflow.models.connection import Connection

    return Connection.get_connection_from_secrets(conn_id)


def _engine(settings: Connections, engine_id: str) -> EngineClient:
    from twinstream.ops.operate import engine_client_factory

    return engine_client_factory(settings, _connection)(engine_id)


def _log_starts(settings: CommonSettings) -> Mapping[int, int]:
    from twinstream.ops.operate import inbound_log_starts

    return inbound_log_starts(settings)


# One ZooKeeper session for what the page reads there: adapters' status nodes, deploys.
_zookeeper = AdapterReader()

app = create_app(
    Sources(
        engines=_engine,
        log_starts=_log_starts,
        adapters=_zookeeper,
        deploys=_zookeeper.last_deploy,
    ),
    auth=requires_authenticated(),
)


class TwinstreamPlugin(AirflowPlugin):
    # Class attributes, as Airflow's plugin manager reads them.
    name = "twinstream"
    fastapi_apps = [  # noqa: RUF012
        {"app": app, "url_prefix": PREFIX, "name": "Twinstream operator view"}
    ]
    external_views = [  # noqa: RUF012
        {
            "name": "Twinstream",
            "href": f"{PREFIX}/",
            "destination": "nav",
            "url_route": "twinstream",
            "nav_top_level": True,
        }
    ]
