import os
import tempfile

# DagBag parsing needs no database, but Airflow reads its config on import: keep it away from
# ~/airflow and from any running stack.
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="twinstream-dagtest-"))
