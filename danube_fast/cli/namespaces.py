"""`danube-fast admin namespaces ...`: the namespace calls of danube_admin (docs/WIRE.md C.14) on a running
broker's admin port, answered for the whole cluster.

    admin namespaces list
    admin namespaces describe NS           (its policy and its topics)
    admin namespaces create NS
    admin namespaces delete NS             (an empty namespace only)

Output: a table, or with --output json an object, as the other areas.
"""

from __future__ import annotations

import argparse
import functools
import json

from danube_fast.cli.admin import Leaf, Listing, Subparsers, admin_command, area, call_method
from danube_fast.proto import DanubeAdmin_pb2 as pb


async def _list(args: argparse.Namespace) -> Listing:
    answer = await call_method(args, "BrokerAdmin", "ListNamespaces", pb.Empty(), pb.NamespaceListResponse)
    return Listing("namespaces", [("namespace", "NAMESPACE")], [{"namespace": n} for n in answer.namespaces])


async def _describe(args: argparse.Namespace) -> Listing:
    request = pb.NamespaceRequest(name=args.namespace)
    policy = await call_method(args, "NamespaceAdmin", "GetNamespacePolicies", request, pb.PolicyResponse)
    topics = await call_method(args, "NamespaceAdmin", "GetNamespaceTopics", request, pb.TopicListResponse)
    return Listing("topics", [("topic", "TOPIC")], [{"topic": "/" + t} for t in topics.topics],
                   {"namespace": args.namespace, "policy": json.loads(policy.policies)})


async def _create(args: argparse.Namespace) -> dict[str, object]:
    await call_method(args, "NamespaceAdmin", "CreateNamespace", pb.NamespaceRequest(name=args.namespace),
               pb.NamespaceResponse)
    return {"namespace": args.namespace, "created": True}


async def _delete(args: argparse.Namespace) -> dict[str, object]:
    await call_method(args, "NamespaceAdmin", "DeleteNamespace", pb.NamespaceRequest(name=args.namespace),
               pb.NamespaceResponse)
    return {"namespace": args.namespace, "deleted": True}


def add_parsers(admin: Subparsers, leaf: Leaf) -> None:
    """The `namespaces` area of `danube-fast admin`; `leaf` is main.py's."""
    command = functools.partial(admin_command, leaf)
    namespaces = area(admin, "namespaces", "list, describe, create and delete namespaces")
    command(namespaces, "list", "namespaces list", _list, "list the cluster's namespaces")
    for name, run, help_text in (
            ("describe", _describe, "show a namespace's policy and its topics"),
            ("create", _create, "create a namespace, with the broker's default policy"),
            ("delete", _delete, "delete a namespace that has no topics")):
        parser = command(namespaces, name, f"namespaces {name}", run, help_text)
        parser.add_argument("namespace", metavar="NS")
