"""The broker: gRPC services over topics, subscriptions and dispatchers, on the storage and metadata
layers."""
