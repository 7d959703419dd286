"""`danube-fast admin brokers|topics|cluster ...`: the admin API (danube_admin, docs/WIRE.md A.4) of a
running broker, reached on `--admin-addr` (default 127.0.0.1:50051). Any broker of a cluster answers: the
ones that do not own a topic or do not lead pass the call on.

    admin brokers list | leader | namespaces | unload ID [--dry-run ...] | activate ID [--reason TEXT]
    admin topics list NS | list --broker ID | describe /ns/t | unload /ns/t | create /ns/t | delete /ns/t
    (describe adds the policy the topic follows and live figures from the owner's metrics: cli/topic_stats.py)
    admin cluster balance | rebalance [--dry-run] [--max-moves N]

Output: aligned tables by default, `--output json` for machines (an object per command; listings hold their
rows in a list named after them). Errors: one line naming what was wrong, exit code 1 (see cli/main.py): a
broker that cannot be reached, or the status and message the broker answered.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc

from danube_fast.cli import feedback
from danube_fast.cli.args import count, positive_float
from danube_fast.cli.topic_stats import TopicStats, topic_stats
from danube_fast.client.credentials import Credentials, open_channel
from danube_fast.client.rpc import M, WireMessage, dial_target, method_path
from danube_fast.errors import DanubeError
from danube_fast.proto import DanubeAdmin_pb2 as pb
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import Replication_pb2 as replication_pb

DEFAULT_ADDR = "127.0.0.1:50051"
DEFAULT_TIMEOUT = 10.0
DRAIN_DEFAULT_SECONDS = 60  # the broker's wait for reassignments when --drain-timeout is 0

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Run: TypeAlias = "Callable[[argparse.Namespace], Awaitable[dict[str, object] | Listing | str]]"
Leaf: TypeAlias = "Callable[[Subparsers, str, str, Run, str, str], argparse.ArgumentParser]"


class AdminCallFailed(DanubeError):
    """The broker could not be reached, or answered with an error status."""


@dataclass
class Listing:
    """A command's result: some fields, then rows (a table; in JSON, the list `name`)."""

    name: str
    columns: Sequence[tuple[str, str]]  # (field, header)
    rows: list[dict[str, object]]
    fields: dict[str, object] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {**self.fields, self.name: self.rows}

    def as_table(self) -> str:
        lines = []
        if self.fields:
            width = max(len(k) for k in self.fields)
            lines += [f"{k.ljust(width)}  {v}" for k, v in self.fields.items()]
            lines.append("")
        if not self.rows:
            return "\n".join([*lines, f"(no {self.name})"])
        cells = [[header for _, header in self.columns]]
        cells += [[_cell(row[key]) for key, _ in self.columns] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
        return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if value == "":
        return "-"
    return str(value)


# -- calls ------------------------------------------------------------------------------------------------

async def call_method(args: argparse.Namespace, service: str, method: str, request: WireMessage,
                      reply: type[M], *, longer: float = 0.0) -> M:
    """One RPC named by its service and method (client/rpc.py) to the broker at --admin-addr, within
    --timeout (+ `longer` for calls that wait)."""
    return await call(args, method_path(service, method), request, reply, longer=longer)


def credentials(args: argparse.Namespace) -> Credentials | None:
    """TLS (and a token) from --tls-ca/--tls-cert/--tls-key/--token (or DANUBE_TOKEN); None: plaintext."""
    token = args.token or os.environ.get("DANUBE_TOKEN") or None
    if not (args.tls_ca or args.tls_cert or token):
        return None
    return Credentials(ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key, token=token)


async def call(args: argparse.Namespace, path: str, request: WireMessage, reply: type[M], *,
               longer: float = 0.0, port: str = "admin_addr") -> M:
    """One RPC (`/package.Service/Method`) to the broker at --admin-addr (or the option `port` names), within
    --timeout (+ `longer`)."""
    target = dial_target(getattr(args, port))
    option = "--" + port.replace("_", "-")
    async with open_channel(target, (), credentials(args)) as channel:
        stub = channel.unary_unary(path,
                                   request_serializer=type(request).SerializeToString,
                                   response_deserializer=reply.FromString)
        try:
            answer: M = await stub(request, timeout=args.timeout + longer)
        except grpc.aio.AioRpcError as e:
            code, details = e.code(), " ".join((e.details() or "").split())
            if code == grpc.StatusCode.UNAVAILABLE and channel.get_state() != grpc.ChannelConnectivity.READY:
                raise AdminCallFailed(f"cannot reach the broker at {target} ({option}): {details}") from e
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise AdminCallFailed(f"no answer from the broker at {target} within "
                                      f"{args.timeout + longer:g} s") from e
            raise AdminCallFailed(f"the broker at {target} answered {code.name}: {details}") from e
    return answer


# -- brokers ----------------------------------------------------------------------------------------------

BROKER_COLUMNS = [("broker_id", "BROKER ID"), ("role", "ROLE"), ("status", "STATUS"),
                  ("broker_addr", "BROKER ADDR"), ("admin_addr", "ADMIN ADDR"),
                  ("metrics_addr", "METRICS ADDR")]


async def _brokers_list(args: argparse.Namespace) -> Listing:
    answer = await call_method(args, "BrokerAdmin", "ListBrokers", pb.Empty(), pb.BrokerListResponse)
    return Listing("brokers", BROKER_COLUMNS, [
        {"broker_id": b.broker_id, "role": b.broker_role, "status": b.broker_status,
         "broker_addr": b.broker_addr, "admin_addr": b.admin_addr, "metrics_addr": b.metrics_addr}
        for b in answer.brokers])


async def _brokers_leader(args: argparse.Namespace) -> dict[str, object]:
    answer = await call_method(args, "BrokerAdmin", "GetLeaderBroker", pb.Empty(), pb.BrokerResponse)
    return {"leader": answer.leader}


async def _brokers_namespaces(args: argparse.Namespace) -> Listing:
    answer = await call_method(args, "BrokerAdmin", "ListNamespaces", pb.Empty(), pb.NamespaceListResponse)
    return Listing("namespaces", [("namespace", "NAMESPACE")], [{"namespace": n} for n in answer.namespaces])


async def _brokers_unload(args: argparse.Namespace) -> dict[str, object]:
    request = pb.UnloadBrokerRequest(broker_id=args.broker_id, max_parallel=args.max_parallel,
                                     namespaces_include=args.include, namespaces_exclude=args.exclude,
                                     dry_run=args.dry_run, timeout_seconds=args.drain_timeout)
    unloading = call_method(args, "BrokerAdmin", "UnloadBroker", request, pb.UnloadBrokerResponse,
                      longer=args.drain_timeout or DRAIN_DEFAULT_SECONDS)
    answer = await feedback.waiting(f"broker {args.broker_id}: moving its topics", unloading)
    return {"broker_id": args.broker_id, "dry_run": args.dry_run, "started": answer.started,
            "total": answer.total, "succeeded": answer.succeeded, "failed": answer.failed,
            "pending": answer.pending, "failed_topics": list(answer.failed_topics)}


async def _brokers_activate(args: argparse.Namespace) -> dict[str, object]:
    request = pb.ActivateBrokerRequest(broker_id=args.broker_id, reason=args.reason)
    answer = await call_method(args, "BrokerAdmin", "ActivateBroker", request, pb.ActivateBrokerResponse)
    return {"broker_id": args.broker_id, "activated": answer.success}


# -- topics -----------------------------------------------------------------------------------------------

TOPIC_COLUMNS = [("name", "TOPIC"), ("broker_id", "BROKER"), ("delivery", "DELIVERY")]


async def _topics_list(args: argparse.Namespace) -> Listing:
    if args.broker is not None:
        request: WireMessage = pb.BrokerRequest(broker_id=args.broker)
        answer = await call_method(args, "TopicAdmin", "ListBrokerTopics", request, pb.TopicInfoListResponse)
    else:
        request = pb.NamespaceRequest(name=args.namespace)
        answer = await call_method(args, "TopicAdmin", "ListNamespaceTopics", request,
                                   pb.TopicInfoListResponse)
    return Listing("topics", TOPIC_COLUMNS, [
        {"name": t.name, "broker_id": t.broker_id, "delivery": t.delivery} for t in answer.topics])


SUBSCRIPTION_COLUMNS = [("subscription", "SUBSCRIPTION"), ("consumers", "CONSUMERS"), ("lag", "LAG"),
                        ("unacked", "UNACKED"), ("delivered", "DELIVERED"), ("redelivered", "REDELIVERED")]


async def _topics_describe(args: argparse.Namespace) -> Listing:
    """The admin API's description, the policy it follows (its own or its namespace's: cli/policies.py), and
    the live figures of the topic and each subscription from its broker's metrics (cli/topic_stats.py);
    without them, a line says why."""
    d = await call_method(args, "TopicAdmin", "DescribeTopic", pb.DescribeTopicRequest(name=args.topic),
                    pb.DescribeTopicResponse)
    found: dict[str, object] = {"name": d.name, "broker_id": d.broker_id, "delivery": d.delivery}
    for optional in ("schema_subject", "schema_id", "schema_version", "schema_type", "compatibility_mode"):
        if d.HasField(optional):
            found[optional] = getattr(d, optional)
    policy = await call(args, "/danube_fast.policy.v1.PolicyAdmin/GetTopicPolicy",
                        policy_pb.TopicPolicyRequest(topic=d.name), policy_pb.PolicyView)
    found["policy"] = policy.policy
    found["policy_source"] = "own" if policy.own else "namespace"
    found.update(await _copies(args, d.name))
    stats = TopicStats()
    brokers = await call_method(args, "BrokerAdmin", "ListBrokers", pb.Empty(), pb.BrokerListResponse)
    owner = next((b for b in brokers.brokers if b.broker_id == d.broker_id), None)
    if owner is None or not owner.metrics_addr:
        found["live"] = "unavailable: the owner registered no metrics address"
    else:
        try:
            stats = await topic_stats(args, owner.metrics_addr, d.name)
            found.update(stats.figures)
        except (OSError, ValueError) as e:
            found["live"] = f"unavailable: {owner.metrics_addr}: {' '.join(str(e).split())}"
    rows: list[dict[str, object]] = []
    for name in d.subscriptions:
        live = stats.subscriptions.get(name, {})
        rows.append({"subscription": name, **{key: live.get(key, "") for key, _ in SUBSCRIPTION_COLUMNS[1:]}})
    return Listing("subscriptions", SUBSCRIPTION_COLUMNS, rows, found)


async def _copies(args: argparse.Namespace, topic: str) -> dict[str, object]:
    """The copies of a replicated topic (docs/REPLICATION.md): how many, which brokers follow, which are in
    sync and how far behind; nothing for a broker that does not replicate (standalone)."""
    try:
        got = await call_method(args, "Replication", "Copies", replication_pb.CopiesRequest(topic=topic),
                                replication_pb.CopiesResponse)
    except AdminCallFailed as e:
        if "UNIMPLEMENTED" in str(e):
            return {}
        raise
    return {"replication_factor": got.replication_factor, "min_insync_replicas": got.min_insync_replicas,
            "in_sync": got.in_sync, "under_replicated": got.under_replicated,
            "followers": ", ".join(f"{f.broker_id} ({'in sync' if f.in_sync else 'catching up'}"
                                   + (f", {f.behind} behind)" if f.behind >= 0 else ")")
                                   for f in got.followers) or "none"}


async def _topics_unload(args: argparse.Namespace) -> dict[str, object]:
    await call_method(args, "TopicAdmin", "UnloadTopic", pb.TopicRequest(name=args.topic), pb.TopicResponse)
    return {"unloaded": args.topic}


async def _topics_create(args: argparse.Namespace) -> dict[str, object]:
    strategy = pb.Reliable if args.reliable else pb.NonReliable
    if args.partitions:
        request: WireMessage = pb.PartitionedTopicRequest(base_name=args.topic, partitions=args.partitions,
                                                          dispatch_strategy=strategy,
                                                          schema_subject=args.schema_subject)
        await call_method(args, "TopicAdmin", "CreatePartitionedTopic", request, pb.TopicResponse)
    else:
        request = pb.NewTopicRequest(name=args.topic, dispatch_strategy=strategy,
                                     schema_subject=args.schema_subject)
        await call_method(args, "TopicAdmin", "CreateTopic", request, pb.TopicResponse)
    return {"created": args.topic, "partitions": args.partitions,
            "delivery": "Reliable" if args.reliable else "NonReliable"}


async def _topics_delete(args: argparse.Namespace) -> dict[str, object]:
    await call_method(args, "TopicAdmin", "DeleteTopic", pb.TopicRequest(name=args.topic), pb.TopicResponse)
    return {"deleted": args.topic}


# -- cluster ----------------------------------------------------------------------------------------------

BALANCE_COLUMNS = [("broker_id", "BROKER ID"), ("load", "LOAD"), ("topic_count", "TOPICS"),
                   ("is_overloaded", "OVERLOADED"), ("is_underloaded", "UNDERLOADED")]
MOVE_COLUMNS = [("topic", "TOPIC"), ("from_broker", "FROM"), ("to_broker", "TO"), ("estimated_load", "LOAD"),
                ("reason", "REASON")]


async def _cluster_balance(args: argparse.Namespace) -> Listing:
    b = await call_method(args, "BrokerAdmin", "GetClusterBalance", pb.ClusterBalanceRequest(),
                    pb.ClusterBalanceResponse)
    rows: list[dict[str, object]] = [
        {"broker_id": x.broker_id, "load": x.load, "topic_count": x.topic_count,
         "is_overloaded": x.is_overloaded, "is_underloaded": x.is_underloaded} for x in b.brokers]
    return Listing("brokers", BALANCE_COLUMNS, rows, {
        "broker_count": b.broker_count, "mean_load": b.mean_load, "min_load": b.min_load,
        "max_load": b.max_load, "std_deviation": b.std_deviation,
        "coefficient_of_variation": b.coefficient_of_variation, "assignment_strategy": b.assignment_strategy})


async def _cluster_rebalance(args: argparse.Namespace) -> Listing:
    request = pb.RebalanceRequest(dry_run=args.dry_run, max_moves=args.max_moves)
    r = await call_method(args, "BrokerAdmin", "TriggerRebalance", request, pb.RebalanceResponse)
    fields: dict[str, object] = {"dry_run": args.dry_run, "success": r.success,
                                 "moves_executed": r.moves_executed}
    if r.error_message:
        fields["message"] = r.error_message
    rows: list[dict[str, object]] = [
        {"topic": m.topic_name, "from_broker": m.from_broker, "to_broker": m.to_broker,
         "estimated_load": m.estimated_load, "reason": m.reason} for m in r.proposed_moves]
    return Listing("moves", MOVE_COLUMNS, rows, fields)


# -- parsers ----------------------------------------------------------------------------------------------

def connection_options(parser: argparse.ArgumentParser) -> None:
    """How an admin command reaches its broker: address, timeout, TLS and token (docs/SECURITY.md)."""
    parser.add_argument("--admin-addr", default=DEFAULT_ADDR, metavar="HOST:PORT",
                        help=f"the broker's admin API (default: {DEFAULT_ADDR})")
    parser.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"give up on a broker that does not answer after this long "
                             f"(default: {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--tls-ca", metavar="PEM", help="TLS: the CA that signed the broker's certificate")
    parser.add_argument("--tls-cert", metavar="PEM", help="mTLS: this client's certificate")
    parser.add_argument("--tls-key", metavar="PEM", help="mTLS: this client's key")
    parser.add_argument("--token", metavar="JWT", help="a bearer token (default: $DANUBE_TOKEN); implies TLS")


def area(admin: Subparsers, name: str, help_text: str) -> Subparsers:
    """An area of `danube-fast admin` (`brokers`, `topics`, ...): its commands go under it."""
    return admin.add_parser(name, help=help_text).add_subparsers(dest="action", required=True,
                                                                 metavar="ACTION")


def admin_command(leaf: Leaf, parent: Subparsers, name: str, what: str, run: Run,
                  help_text: str) -> argparse.ArgumentParser:
    """A command of an area that calls the admin port (with the connection options)."""
    parser = leaf(parent, name, what, run, help_text, help_text[0].upper() + help_text[1:] + ".")
    connection_options(parser)
    return parser


def add_parsers(admin: Subparsers, leaf: Leaf) -> None:
    """The `brokers`, `topics` and `cluster` areas of `danube-fast admin`; `leaf` is main.py's."""
    command = functools.partial(admin_command, leaf)

    brokers = area(admin, "brokers", "list, drain and activate brokers")
    command(brokers, "list", "brokers list", _brokers_list, "list the registered brokers")
    command(brokers, "leader", "brokers leader", _brokers_leader, "show the leader broker")
    command(brokers, "namespaces", "brokers namespaces", _brokers_namespaces, "list the cluster's namespaces")
    u = command(brokers, "unload", "brokers unload", _brokers_unload,
                "drain a broker: mark it draining and move its topics to other brokers")
    u.add_argument("broker_id", metavar="ID")
    u.add_argument("--dry-run", action="store_true", help="only count the topics that would move")
    u.add_argument("--max-parallel", type=count, default=0, metavar="N",
                   help="topics moved at once (default: 0, the broker's choice)")
    u.add_argument("--include", action="append", default=[], metavar="NS",
                   help="move only the topics of this namespace (repeatable)")
    u.add_argument("--exclude", action="append", default=[], metavar="NS",
                   help="leave the topics of this namespace (repeatable)")
    u.add_argument("--drain-timeout", type=count, default=0, metavar="SECONDS",
                   help="how long the broker waits for the topics to be reassigned; the rest are reported "
                        f"pending (default: 0, the broker's choice, {DRAIN_DEFAULT_SECONDS} s)")
    a = command(brokers, "activate", "brokers activate", _brokers_activate,
                "make a drained broker active again")
    a.add_argument("broker_id", metavar="ID")
    a.add_argument("--reason", default="", help="recorded in the broker's state (default: admin_activate)")

    topics = area(admin, "topics", "list, describe, create, delete and unload topics")
    ls = command(topics, "list", "topics list", _topics_list,
                 "list the topics of a namespace (or of a broker) with their owners")
    which = ls.add_mutually_exclusive_group(required=True)
    which.add_argument("namespace", nargs="?", metavar="NS")
    which.add_argument("--broker", metavar="ID", help="the topics assigned to this broker instead")

    def on_topic(name: str, run: Run, help_text: str
                 ) -> argparse.ArgumentParser:
        parser = command(topics, name, f"topics {name}", run, help_text)
        parser.add_argument("topic", metavar="/NS/TOPIC")
        return parser

    on_topic("describe", _topics_describe, "show a topic's owner, delivery, schema, policy and "
                                           "live figures: messages in, each subscription's consumers and lag")
    on_topic("unload", _topics_unload, "unload a topic from its broker so that another one takes it")
    c = on_topic("create", _topics_create, "create a topic")
    c.add_argument("--partitions", type=count, default=0, metavar="N",
                   help="create N partitions /NS/TOPIC-part-0.. instead of one topic")
    c.add_argument("--reliable", action="store_true", help="Reliable delivery (default: NonReliable)")
    c.add_argument("--schema-subject", metavar="SUBJECT", help="a registered schema subject the topic uses")
    on_topic("delete", _topics_delete, "delete a topic (a partitioned topic: all its partitions)")

    cluster = area(admin, "cluster", "cluster balance and rebalancing")
    command(cluster, "balance", "cluster balance", _cluster_balance, "show how evenly topics are spread")
    r = command(cluster, "rebalance", "cluster rebalance", _cluster_rebalance,
                "move topics from the busiest brokers to the idlest (the leader decides)")
    r.add_argument("--dry-run", action="store_true", help="only show the moves")
    r.add_argument("--max-moves", type=count, metavar="N", help="at most N moves")
