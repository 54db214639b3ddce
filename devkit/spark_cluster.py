"""A Spark standalone cluster of its own for a test: the master and one worker the local
stack runs with TWINSTREAM_SPARK_STANDALONE (the same renderers, the same pyspark
distribution), each a process this kit starts and stops by pid.

    with StandaloneCluster(settings, tmp_path / "spark") as cluster:
        env = {"TWINSTREAM_SPARK_MASTER": cluster.master}
"""

from __future__ import annotations

from pathlib import Path

from devkit.harness import wait_for
from devkit.services import LocalServices
from twinstream.platform.settings import Settings
from twinstream.stack import health, render
from twinstream.stack.layout import Layout


class StandaloneCluster(LocalServices):
    """A master and one worker of `cores` cores on bind_host; ports (master, its UI, the
    worker's UI) fixed, as the test stack's are. Stopped worker first (it stops its
    executors), then the master."""

    def __init__(
        self,
        settings: Settings,
        folder: Path,
        cores: int = 2,
        ports: tuple[int, int, int] = (27077, 28090, 28091),
    ) -> None:
        super().__init__()
        master, master_ui, worker_ui = ports
        self.settings = settings.model_copy(
            update={
                "state_dir": folder,
                "spark_standalone": True,
                "spark_master_port": master,
                "spark_master_ui_port": master_ui,
                "spark_worker_ui_port": worker_ui,
                "spark_worker_cores": cores,
            }
        )
        self.layout = Layout.of(self.settings)

    @property
    def master(self) -> str:
        return self.settings.engine_spark_master

    def start(self) -> None:
        for program in render.spark_standalone(self.settings, self.layout, {}):
            self.spawn(program.command, self.layout.log_file(program.name), program.environment)
        wait_for(
            lambda: health.spark_worker(self.settings.spark_master_ui_url)[0],
            90,
            "the Spark worker registered with its master",
            every_s=0.5,
        )
