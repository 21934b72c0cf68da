"""Backends of metering.kafka: `confluent` (confluent-kafka) and `kafka_python` (kafka-python).

Import metering.kafka, not these modules: the factories there pick the backend by name."""
