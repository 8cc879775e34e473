"""The relay: moves outbox rows to Kafka as CloudEvents, in per-run order, across replicas."""
