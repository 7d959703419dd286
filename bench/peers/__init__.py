"""The peers of the end-to-end benchmark: NATS JetStream, Redis Streams and RabbitMQ Streams, driven by their
official Python clients with the same workload as ours. `python -m bench.peers.install` installs the servers;
`python -m bench.peers` runs them (see bench/README.md, "Peers")."""
