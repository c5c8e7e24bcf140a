"""Shared building blocks: settings, errors, the plugin registry, event contracts and the Kafka publisher."""
