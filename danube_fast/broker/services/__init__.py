"""One module per gRPC service of the Danube API; each maps broker errors to gRPC statuses."""
