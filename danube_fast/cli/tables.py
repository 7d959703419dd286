"""`danube-fast admin tables status /NS/TOPIC` (docs/TABLES.md): what a topic's Iceberg table holds, from the
TableAdmin service of the broker that writes it. A partitioned topic shows one row per partition.

Output: the catalog, then a row per stored topic (committed offset, lag, files, bytes, DLQ and skipped
records, the metadata file any Iceberg reader opens, and what is wrong); `--output json` for machines.

`danube-fast admin tables snapshots /NS/TOPIC`: the snapshots the table keeps, oldest first, with the offsets
each held (what pyspark_danube's read_table reads with snapshotId).
"""

from __future__ import annotations

import argparse
import datetime

from danube_fast.cli.admin import Leaf, Listing, Subparsers, call_method, connection_options
from danube_fast.proto import TableAdmin_pb2 as pb

COLUMNS = (("stored_topic", "TOPIC"), ("mode", "MODE"), ("committed_offset", "COMMITTED"),
           ("topic_offset", "TOPIC OFFSET"), ("lag_ms", "LAG MS"), ("files", "FILES"), ("bytes", "BYTES"),
           ("dlq_records", "DLQ"), ("skipped_records", "SKIPPED"), ("problem", "PROBLEM"))


async def _status(args: argparse.Namespace) -> Listing:
    got = await call_method(args, "TableAdmin", "Status", pb.TableStatusRequest(topic=args.topic),
                     pb.TableStatusResponse)
    rows: list[dict[str, object]] = []
    for t in got.tables:
        rows.append({"stored_topic": t.stored_topic, "mode": t.mode, "table": t.table,
                     "committed_offset": t.committed_offset, "topic_offset": t.topic_offset,
                     "lag_ms": t.lag_ms, "files": t.files, "bytes": t.bytes, "dlq_records": t.dlq_records,
                     "skipped_records": t.skipped_records, "commits": t.commits,
                     "compacted_files": t.compacted_files, "partitioning": t.partitioning,
                     "metadata_location": t.metadata_location, "error": t.error, "stopped": t.stopped,
                     "problem": (t.stopped and f"stopped: {t.stopped}") or t.error})
    fields: dict[str, object] = {"catalog": got.catalog_kind, "catalog_uri": got.catalog_uri,
                                 "warehouse": got.warehouse}
    if len(rows) == 1:
        fields["table"] = rows[0]["table"]
        fields["metadata_location"] = rows[0]["metadata_location"]
    return Listing("tables", COLUMNS, rows, fields)


SNAPSHOT_COLUMNS = (("snapshot_id", "SNAPSHOT"), ("committed_at", "COMMITTED AT"), ("operation", "OPERATION"),
                    ("offsets", "OFFSETS"), ("records", "RECORDS"), ("files", "FILES"))


async def _snapshots(args: argparse.Namespace) -> Listing:
    got = await call_method(args, "TableAdmin", "Snapshots", pb.TableStatusRequest(topic=args.topic),
                            pb.TableSnapshotsResponse)
    rows: list[dict[str, object]] = [{
        "snapshot_id": s.snapshot_id,
        "committed_at": datetime.datetime.fromtimestamp(s.committed_at_ms / 1000, datetime.UTC).isoformat(),
        "operation": s.operation, "offsets": dict(sorted(s.offsets.items())), "records": s.records,
        "files": s.files} for s in got.snapshots]
    return Listing("snapshots", SNAPSHOT_COLUMNS, rows, {"table": got.table})


def add_parsers(admin: Subparsers, leaf: Leaf) -> None:
    tables = admin.add_parser("tables", help="topic tables (Iceberg): status, snapshots").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    for name, run, help_text in (
            ("status", _status,
             "show what a topic's table holds: committed offset, lag, files, bytes, problems"),
            ("snapshots", _snapshots,
             "list the snapshots a topic's table keeps, with the offsets each held")):
        parser = leaf(tables, name, f"tables {name}", run, help_text,
                      help_text[0].upper() + help_text[1:] + ".")
        connection_options(parser)
        parser.add_argument("topic", metavar="/NS/TOPIC")
