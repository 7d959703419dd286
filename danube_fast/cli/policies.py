"""`danube-fast admin policies ...` (docs/RETENTION.md): the PolicyAdmin service of a running broker, and the
namespace policy reads of danube_admin.

    admin policies show NS | /NS/TOPIC
    admin policies set NS | /NS/TOPIC [--retention-minutes N] [--retention-mb N] [--table MODE]
                                      [--table-retention-minutes N] [--table-retention-mb N]
                                      [--message-ttl-seconds N] [--replication-factor N]
                                      [--min-insync-replicas N]
                                      [--set KEY=N ...]
    admin policies clear /NS/TOPIC        (the topic goes back to its namespace's policy)

A name starting with "/" is a topic, anything else a namespace. Output: the policy's keys, one a line (or a
JSON object), with `source`: the namespace's or the topic's own.
"""

from __future__ import annotations

import argparse
import json

from danube_fast.cli.admin import Leaf, Run, Subparsers, call, connection_options
from danube_fast.cli.args import count
from danube_fast.errors import DanubeError
from danube_fast.meta.resources import Policy
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import PolicyAdmin_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["PolicyAdmin"].full_name
NAMESPACE_ADMIN = admin_pb.DESCRIPTOR.services_by_name["NamespaceAdmin"].full_name
GET_NAMESPACE = f"/{NAMESPACE_ADMIN}/GetNamespacePolicies"


class BadChanges(DanubeError):
    """`policies set` was given nothing to set, or a --set that is not KEY=N."""


def _path(method: str) -> str:
    return f"/{SERVICE}/{method}"


def _shown(policy: str, source: str) -> dict[str, object]:
    return {"source": source, **json.loads(policy)}


async def _show(args: argparse.Namespace) -> dict[str, object]:
    if not args.name.startswith("/"):
        answer = await call(args, GET_NAMESPACE, admin_pb.NamespaceRequest(name=args.name),
                            admin_pb.PolicyResponse)
        return _shown(answer.policies, f"namespace {args.name}")
    got = await call(args, _path("GetTopicPolicy"), pb.TopicPolicyRequest(topic=args.name), pb.PolicyView)
    return _shown(got.policy, "the topic's own" if got.own else "its namespace's")


def _changes(args: argparse.Namespace) -> str:
    changes: dict[str, int | str] = {}
    if args.retention_minutes is not None:
        changes["retentionTimeInMinutes"] = args.retention_minutes
    if args.retention_mb is not None:
        changes["retentionSizeInMB"] = args.retention_mb
    if args.table is not None:
        changes[Policy.TABLE_MODE] = args.table
    if args.table_partitioning is not None:
        changes[Policy.TABLE_PARTITIONING] = args.table_partitioning
    if args.table_partition_by is not None:
        changes[Policy.TABLE_PARTITION_BY] = args.table_partition_by
    if args.table_retention_minutes is not None:
        changes["tableRetentionInMinutes"] = args.table_retention_minutes
    if args.table_retention_mb is not None:
        changes["tableRetentionSizeInMB"] = args.table_retention_mb
    if args.message_ttl_seconds is not None:
        changes["messageTTLInSeconds"] = args.message_ttl_seconds
    if args.replication_factor is not None:
        changes["replicationFactor"] = args.replication_factor
    if args.min_insync_replicas is not None:
        changes["minInSyncReplicas"] = args.min_insync_replicas
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise BadChanges(f"--set {item!r}: give KEY=N, N a non-negative integer")
        changes[key] = int(value)
    if not changes:
        raise BadChanges("nothing to set: give --retention-minutes, --retention-mb, --table, "
                         "--table-partitioning, --table-partition-by, --table-retention-minutes, "
                         "--table-retention-mb, --message-ttl-seconds, --replication-factor, "
                         "--min-insync-replicas or --set")
    return json.dumps(changes)


async def _set(args: argparse.Namespace) -> dict[str, object]:
    changes = _changes(args)
    if not args.name.startswith("/"):
        got = await call(args, _path("SetNamespacePolicy"),
                         pb.SetNamespacePolicyRequest(namespace=args.name, changes=changes), pb.PolicyView)
        return _shown(got.policy, f"namespace {args.name}")
    request = pb.SetTopicPolicyRequest(topic=args.name, changes=changes)
    got = await call(args, _path("SetTopicPolicy"), request, pb.PolicyView)
    return _shown(got.policy, "the topic's own")


async def _clear(args: argparse.Namespace) -> dict[str, object]:
    got = await call(args, _path("ClearTopicPolicy"), pb.TopicPolicyRequest(topic=args.name), pb.PolicyView)
    return _shown(got.policy, "its namespace's")


def add_parsers(admin: Subparsers, leaf: Leaf) -> None:
    policies = admin.add_parser("policies", help="namespace and topic policies: limits, retention, tables"
                                ).add_subparsers(dest="action", required=True, metavar="ACTION")

    def command(name: str, run: Run, help_text: str, target: str) -> argparse.ArgumentParser:
        parser = leaf(policies, name, f"policies {name}", run, help_text,
                      help_text[0].upper() + help_text[1:] + ".")
        connection_options(parser)
        parser.add_argument("name", metavar=target)
        return parser

    command("show", _show, "show the policy of a namespace, or the one a topic follows", "NS|/NS/TOPIC")
    s = command("set", _set, "change a namespace's policy, or give a topic its own (from the one it follows)",
                "NS|/NS/TOPIC")
    s.add_argument("--retention-minutes", type=count, metavar="N",
                   help="retentionTimeInMinutes: records older than N minutes go (0: kept at any age)")
    s.add_argument("--retention-mb", type=count, metavar="N",
                   help="retentionSizeInMB: the oldest objects beyond N MiB go (0: no size limit)")
    s.add_argument("--table", choices=Policy.TABLE_MODES, metavar="MODE",
                   help="tableMode: keep the records as an Iceberg table too: none, envelope or schema "
                        "(docs/TABLES.md)")
    s.add_argument("--table-partitioning", choices=Policy.TABLE_PARTITIONINGS, metavar="PERIOD",
                   help="tablePartitioning: the table's files by hour (the default), day or month of the "
                        "publish time, or none; a table that exists is evolved (its next files follow)")
    s.add_argument("--table-partition-by", metavar="FIELDS",
                   help="tablePartitionBy: the table's files by these columns too, comma-separated: a "
                        "column, bucket(N, column), truncate(W, column), year|month|day|hour(column) "
                        "(\"\": none); a table that exists is evolved")
    s.add_argument("--table-retention-minutes", type=count, metavar="N",
                   help="tableRetentionInMinutes: the table keeps rows N minutes, by publish time, whole "
                        "periods of its partitioning (0: as long as --retention-minutes)")
    s.add_argument("--table-retention-mb", type=count, metavar="N",
                   help="tableRetentionSizeInMB: the table's oldest whole periods go while its files hold "
                        "more than N MiB (0: as --retention-mb)")
    s.add_argument("--message-ttl-seconds", type=count, metavar="N",
                   help="messageTTLInSeconds: records published more than N seconds ago are acknowledged "
                        "for every subscription (0: never; docs/SUBSCRIPTIONS.md)")
    s.add_argument("--replication-factor", type=count, metavar="N",
                   help="replicationFactor: brokers that keep a Reliable topic's log, the owner's included "
                        "(cluster mode; 0 or 1: the owner alone; docs/REPLICATION.md)")
    s.add_argument("--min-insync-replicas", type=count, metavar="N",
                   help="minInSyncReplicas: copies a record must be on before it is acknowledged; with "
                        "fewer in sync, sends are refused (UNAVAILABLE)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=N",
                   help="any other policy key, e.g. max_message_size=1048576 (repeatable)")
    command("clear", _clear, "remove a topic's own policy: it follows its namespace's again", "/NS/TOPIC")
