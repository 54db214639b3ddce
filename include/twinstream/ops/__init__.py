"""The operations wing: what Airflow tasks, the operator page and the `twinstream` CLI run
against a running platform (operate, audit, retention, drill, overview)."""
