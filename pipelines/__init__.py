"""Example pipelines on the Twinstream contract (twinstream.contract)."""
