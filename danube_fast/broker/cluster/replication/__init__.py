"""Replicated topics (docs/REPLICATION.md): `owner` (a topic's copies as its owner tracks them, what its
acknowledgements wait for), `follower` (the copies this broker keeps of others' topics, fetched from their
owners), `service` (the Replication gRPC service the owner answers fetches on) and `manager` (which
topics are replicated, and the pass that keeps their in-sync sets)."""
