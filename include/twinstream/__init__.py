"""Twinstream: hot-standby PySpark streaming engines with gapless failover through ZooKeeper."""

__version__ = "0.1.0"
