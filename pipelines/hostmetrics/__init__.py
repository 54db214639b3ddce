"""Host metrics: per host, rolling statistics over its last 20 events (one output per
input). The first example pipeline; `pipeline.py` declares it on the contract."""
