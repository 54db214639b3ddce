"""Airflow configuration for every test in this process, set before Airflow is imported.

Airflow reads its configuration once, on import. DagBag parsing needs no database, and the
DAG runs of the integration tests (`dag.test()`) use a SQLite database of their own in a
temporary AIRFLOW_HOME: never ~/airflow, never a running stack's.
"""

import os
import tempfile

from twinstream.config import REPO_ROOT

os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="twinstream-airflow-test-"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO_ROOT / "dags"))
