"""Platform: what every process of Twinstream shares: its settings, the pipelines file, Kafka
clients and their security, and the storage snapshots and checkpoints live on."""
