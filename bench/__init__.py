"""Benchmarks of the running stack (`python -m bench.<name>`) and their kit: the Flink and
Kafka Streams baselines (`bench.baseline`) and the plots (`bench.plots`)."""
