"""Keyed state at any key count: the runner of a pipeline's `Keyed.step` (runs in Spark's
Python workers). `keyed` is the pure part (a partition's records through the step, the
state of every key in a dict); `processor` keeps that dict in Spark's state store, one
store per inbound partition, so that a micro-batch costs a few state calls, not a few per
key."""
