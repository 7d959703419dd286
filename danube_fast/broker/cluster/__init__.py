"""Cluster coordination (docs/TOPIC_MOVE.md, docs/METADATA.md#election-and-the-controller-epoch): membership
under a lease, leader election, the load manager on the leader, and the broker side of topic placement (load,
sealed unload, orphan recovery).

Standalone mode runs the same membership (a cluster of one that leads itself) on the embedded store, so the
admin API and the metadata look the same in both modes.
"""
