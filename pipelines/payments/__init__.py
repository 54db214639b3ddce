"""Card payments: per card, spend and count over the last 10 minutes of event time, and
an alert when a limit or a velocity is passed (zero or one output per input). The second
example pipeline; `pipeline.py` declares it on the contract."""
