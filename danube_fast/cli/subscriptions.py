"""`danube-fast admin subscriptions ...`: a topic's subscriptions on a running broker's admin port
(docs/SUBSCRIPTIONS.md), answered for the whole cluster.

    admin subscriptions list /NS/TOPIC             (each one's type, position, backlog, unacked, consumers)
    admin subscriptions describe /NS/TOPIC SUB     (type, position, backlog, unacked, delayed, consumers)
    admin subscriptions create /NS/TOPIC SUB [--position earliest|latest|OFFSET] [--type TYPE]
    admin subscriptions seek /NS/TOPIC SUB (--offset N | --time ISO8601 | --earliest | --latest |
                                            --shift N) [--dry-run]
    admin subscriptions skip /NS/TOPIC SUB (--count N | --all) [--dry-run]
    admin subscriptions peek /NS/TOPIC SUB [--count N]
    admin subscriptions browse /NS/TOPIC (--offset N | --time ISO8601 | --earliest | --latest) [--backward]
                                         [--count N]   (the topic's records, no subscription needed)
    admin subscriptions delete /NS/TOPIC SUB       (one without active consumers)

A partitioned topic's base name stands for every partition: one row each. Output: a table, or with
--output json an object, as the other areas.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import functools

from danube_fast.cli.admin import Leaf, Listing, Run, Subparsers, admin_command, area, call_method
from danube_fast.cli.args import count
from danube_fast.client.rpc import M, WireMessage
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import SubscriptionAdmin_pb2 as pb

TYPES = {"exclusive": 0, "shared": 1, "failover": 2, "key_shared": 3}
POSITION_COLUMNS = (("stored_topic", "TOPIC"), ("from_offset", "FROM"), ("to_offset", "TO"),
                    ("records", "RECORDS"), ("moved", "MOVED"))
STATE_COLUMNS = (("stored_topic", "TOPIC"), ("type", "TYPE"), ("position", "POSITION"), ("end_offset", "END"),
                 ("backlog", "BACKLOG"), ("unacked", "UNACKED"), ("delayed", "DELAYED"),
                 ("served_by", "SERVED BY"), ("consumers", "CONSUMERS"))
LIST_COLUMNS = (("stored_topic", "TOPIC"), ("subscription", "SUBSCRIPTION"), ("type", "TYPE"),
                ("position", "POSITION"), ("backlog", "BACKLOG"), ("unacked", "UNACKED"),
                ("consumers", "CONSUMERS"))
PEEK_COLUMNS = (("stored_topic", "TOPIC"), ("offset", "OFFSET"), ("publish_time", "PUBLISHED"),
                ("key", "KEY"), ("payload", "PAYLOAD"))


async def _ask(args: argparse.Namespace, method: str, request: WireMessage, reply: type[M]) -> M:
    """One SubscriptionAdmin call."""
    return await call_method(args, "SubscriptionAdmin", method, request, reply)


async def _list(args: argparse.Namespace) -> Listing:
    answer = await _ask(args, "List", pb.ListRequest(topic=args.topic), pb.DescribeResponse)
    rows = []
    for s in answer.partitions:
        row = _state_row(s)
        row["consumers"] = sum(1 for c in s.consumers if c.active)  # with an open stream
        rows.append(row)
    return Listing("subscriptions", LIST_COLUMNS, rows, {"topic": args.topic})


async def _delete(args: argparse.Namespace) -> dict[str, object]:
    request = admin_pb.SubscriptionRequest(topic=args.topic, subscription=args.subscription)
    await call_method(args, "TopicAdmin", "Unsubscribe", request, admin_pb.SubscriptionResponse)
    return {"topic": args.topic, "subscription": args.subscription, "deleted": True}


def _positions(args: argparse.Namespace, answer: pb.PositionsResponse) -> Listing:
    rows: list[dict[str, object]] = [
        {"stored_topic": p.stored_topic, "from_offset": p.from_offset, "to_offset": p.to_offset,
         "records": p.records, "moved": p.moved} for p in answer.positions]
    return Listing("positions", POSITION_COLUMNS, rows,
                   {"topic": args.topic, "subscription": args.subscription})


def _time_ms(text: str) -> int:
    """An ISO 8601 time as ms since the epoch; without a zone it is UTC."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (2026-11-29T08:00:00Z)") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


async def _seek(args: argparse.Namespace) -> Listing:
    request = pb.SeekRequest(topic=args.topic, subscription=args.subscription, dry_run=args.dry_run)
    if args.offset is not None:
        request.offset = args.offset
    elif args.time is not None:
        request.time_ms = args.time
    elif args.earliest:
        request.earliest = True
    elif args.latest:
        request.latest = True
    else:
        request.shift = args.shift
    return _positions(args, await _ask(args, "Seek", request, pb.PositionsResponse))


async def _skip(args: argparse.Namespace) -> Listing:
    request = pb.SkipRequest(topic=args.topic, subscription=args.subscription, dry_run=args.dry_run)
    if args.all:
        request.all = True
    else:
        request.records = args.count
    return _positions(args, await _ask(args, "Skip", request, pb.PositionsResponse))


async def _create(args: argparse.Namespace) -> Listing:
    request = pb.CreateRequest(topic=args.topic, subscription=args.subscription,
                               subscription_type=TYPES[args.type])
    if args.position == "earliest":
        request.earliest = True
    elif args.position == "latest":
        request.latest = True
    elif args.position.isdigit():
        request.offset = int(args.position)
    else:
        raise argparse.ArgumentTypeError(f"--position {args.position!r}: expected earliest, latest or an "
                                         "offset")
    return _positions(args, await _ask(args, "Create", request, pb.PositionsResponse))


async def _describe(args: argparse.Namespace) -> Listing:
    answer = await _ask(args, "Describe",
                        pb.DescribeRequest(topic=args.topic, subscription=args.subscription),
                        pb.DescribeResponse)
    rows = [_state_row(s) for s in answer.partitions]
    for row in rows:
        del row["subscription"]
    return Listing("partitions", STATE_COLUMNS, rows,
                   {"topic": args.topic, "subscription": args.subscription})


def _state_row(s: pb.SubscriptionState) -> dict[str, object]:
    return {"stored_topic": s.stored_topic, "subscription": s.subscription, "type": s.type,
            "position": s.position, "end_offset": s.end_offset, "backlog": s.backlog, "unacked": s.unacked,
            "delayed": s.delayed, "served_by": s.served_by,
            "consumers": [{"name": c.name, "active": c.active} for c in s.consumers]}


async def _peek(args: argparse.Namespace) -> Listing:
    answer = await _ask(args, "Peek",
                        pb.PeekRequest(topic=args.topic, subscription=args.subscription, count=args.count),
                        pb.PeekResponse)
    return Listing("records", PEEK_COLUMNS, [_record_row(r) for r in answer.records],
                   {"topic": args.topic, "subscription": args.subscription})


async def _browse(args: argparse.Namespace) -> Listing:
    request = pb.BrowseRequest(topic=args.topic, backward=args.backward, count=args.count)
    if args.offset is not None:
        request.offset = args.offset
    elif args.time is not None:
        request.time_ms = args.time
    elif args.earliest:
        request.earliest = True
    else:
        request.latest = True
    answer = await _ask(args, "Browse", request, pb.BrowseResponse)
    ranges = [{"stored_topic": r.stored_topic, "start_offset": r.start_offset, "end_offset": r.end_offset}
              for r in answer.ranges]
    return Listing("records", PEEK_COLUMNS, [_record_row(r) for r in answer.records],
                   {"topic": args.topic, "ranges": ranges})


def _record_row(r: pb.PeekedRecord) -> dict[str, object]:
    """A record as peek and browse print it: the payload as text when it is UTF-8, else in base64."""
    row: dict[str, object] = {
        "stored_topic": r.stored_topic, "offset": r.offset, "publish_time": r.publish_time_ms,
        "producer_name": r.producer_name, "key": r.key if r.HasField("key") else None,
        "attributes": dict(r.attributes),
        "schema_id": r.schema_id if r.HasField("schema_id") else None,
        "schema_version": r.schema_version if r.HasField("schema_version") else None}
    try:
        row["payload"] = r.payload.decode("utf-8")
    except UnicodeDecodeError:
        row["payload"] = None
        row["payload_base64"] = base64.b64encode(r.payload).decode("ascii")
    return row


def add_parsers(admin: Subparsers, leaf: Leaf) -> None:
    """The `subscriptions` area of `danube-fast admin`; `leaf` is main.py's."""
    command = functools.partial(admin_command, leaf)
    subs = area(admin, "subscriptions", "list, describe, create, seek, skip, peek and delete subscriptions, "
                                        "and browse a topic's records")
    command(subs, "list", "subscriptions list", _list,
            "list a topic's subscriptions").add_argument("topic", metavar="/NS/TOPIC")

    def named(name: str, run: Run, help_text: str) -> argparse.ArgumentParser:
        parser = command(subs, name, f"subscriptions {name}", run, help_text)
        parser.add_argument("topic", metavar="/NS/TOPIC")
        parser.add_argument("subscription", metavar="SUB")
        return parser

    named("describe", _describe, "show a subscription's type, position, backlog, unacked records and "
                                 "consumers")
    c = named("create", _create, "create a subscription before its first consumer, at a position")
    c.add_argument("--position", default="latest", metavar="earliest|latest|OFFSET",
                   help="where its first delivery is (default: latest, as a consumer's own new one)")
    c.add_argument("--type", choices=tuple(TYPES), default="exclusive",
                   help="its type, which consumers then join as it is (default: exclusive)")
    s = named("seek", _seek, "move a subscription to an offset, a time, the start or the end, or by a "
                             "shift; its consumers get the records from there")
    to = s.add_mutually_exclusive_group(required=True)
    to.add_argument("--offset", type=int, metavar="N", help="the next record delivered is offset N's")
    to.add_argument("--time", type=_time_ms, metavar="ISO8601",
                    help="the first record published at or after this time (UTC unless it says)")
    to.add_argument("--earliest", action="store_true", help="the first record the topic keeps")
    to.add_argument("--latest", action="store_true", help="the end: only records published from now on")
    to.add_argument("--shift", type=int, metavar="N", help="N offsets from the position (negative: back)")
    s.add_argument("--dry-run", action="store_true", help="show where it would go; change nothing")
    k = named("skip", _skip, "skip records from a subscription's position (or all of its backlog)")
    howmany = k.add_mutually_exclusive_group(required=True)
    howmany.add_argument("--count", type=count, metavar="N", help="skip N records")
    howmany.add_argument("--all", action="store_true", help="skip everything published so far")
    k.add_argument("--dry-run", action="store_true", help="show where it would go; change nothing")
    p = named("peek", _peek, "show the next records a subscription would receive, without delivering or "
                             "acknowledging anything")
    p.add_argument("--count", type=count, default=1, metavar="N", help="records to show (default 1, at most "
                                                                       "1000; per partition)")
    b = command(subs, "browse", "subscriptions browse", _browse,
                "show a topic's records from an offset or a time, forwards or backwards, without a "
                "subscription; nothing is delivered or acknowledged")
    b.add_argument("topic", metavar="/NS/TOPIC")
    start = b.add_mutually_exclusive_group(required=True)
    start.add_argument("--offset", type=int, metavar="N", help="from offset N")
    start.add_argument("--time", type=_time_ms, metavar="ISO8601",
                       help="from the first record published at or after this time (UTC unless it says)")
    start.add_argument("--earliest", action="store_true", help="from the first record the topic keeps")
    start.add_argument("--latest", action="store_true",
                       help="from the end (with --backward: the last records)")
    b.add_argument("--backward", action="store_true",
                   help="the records before the start instead of from it (still shown in offset order)")
    b.add_argument("--count", type=count, default=1, metavar="N",
                   help="records to show (default 1, at most 1000; per partition)")
    named("delete", _delete, "delete a subscription and its cursor (refused while a consumer of it is "
                             "connected)")
