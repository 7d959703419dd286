"""`danube-fast schema ...`: the schema registry (docs/WIRE.md C.13, docs/SCHEMAS.md) on a broker's client
port (`--addr`, default 127.0.0.1:6650); any broker of a cluster answers, the registry is the cluster's.

    schema register SUBJECT --type TYPE (--file PATH | --definition TEXT) [--description D] [--tag T ...]
    schema get SUBJECT [--version N]       the fields, then the definition as registered
    schema versions SUBJECT
    schema check SUBJECT --type TYPE (--file PATH | --definition TEXT) [--mode MODE]
    schema mode SUBJECT MODE               none, backward, forward or full
    schema delete SUBJECT VERSION

`check` exits 1 when the definition is not compatible (one line per reason on stderr), so a build can gate
on it. Output and exit codes otherwise as every command (cli/main.py).
"""

from __future__ import annotations

import argparse

from danube_fast.cli.admin import AdminCallFailed, Leaf, Listing, Run, Subparsers, call
from danube_fast.cli.args import count, positive_float
from danube_fast.cli.messages import DEFAULT_ADDR
from danube_fast.client.rpc import M, WireMessage
from danube_fast.proto import SchemaRegistry_pb2 as pb
from danube_fast.proto.SchemaRegistry_pb2 import DESCRIPTOR

SERVICE = DESCRIPTOR.services_by_name["SchemaRegistry"].full_name
TYPES = ("bytes", "string", "number", "avro", "json_schema", "protobuf")
MODES = ("none", "backward", "forward", "full")
VERSION_COLUMNS = [("version", "VERSION"), ("schema_id", "SCHEMA ID"), ("created_at", "CREATED AT"),
                   ("created_by", "CREATED BY"), ("description", "DESCRIPTION"),
                   ("fingerprint", "FINGERPRINT")]


async def _call(args: argparse.Namespace, method: str, request: WireMessage, reply: type[M]) -> M:
    return await call(args, f"/{SERVICE}/{method}", request, reply, port="addr")


def _definition(args: argparse.Namespace) -> bytes:
    if args.definition is not None:
        return str(args.definition).encode()
    try:
        with open(args.file, "rb") as f:
            return f.read()
    except OSError as e:
        raise AdminCallFailed(f"cannot read --file: {e}") from e


async def _register(args: argparse.Namespace) -> dict[str, object]:
    r = await _call(args, "RegisterSchema", pb.RegisterSchemaRequest(
        subject=args.subject, schema_type=args.type, schema_definition=_definition(args),
        description=args.description, created_by=args.created_by, tags=args.tag), pb.RegisterSchemaResponse)
    return {"subject": args.subject, "schema_id": r.schema_id, "version": r.version,
            "new_version": r.is_new_version, "fingerprint": r.fingerprint}


async def _get(args: argparse.Namespace) -> dict[str, object]:
    latest = await _call(args, "GetLatestSchema", pb.GetLatestSchemaRequest(subject=args.subject),
                         pb.GetSchemaResponse)
    found = latest
    if args.version is not None and args.version != latest.version:
        request = pb.GetSchemaRequest(schema_id=latest.schema_id, version=args.version)
        found = await _call(args, "GetSchema", request, pb.GetSchemaResponse)
    return {"subject": found.subject, "schema_id": found.schema_id, "version": found.version,
            "latest_version": latest.version, "type": found.schema_type,
            "compatibility_mode": found.compatibility_mode, "description": found.description,
            "created_at": found.created_at, "created_by": found.created_by, "tags": list(found.tags),
            "fingerprint": found.fingerprint,
            "definition": found.schema_definition.decode("utf-8", errors="backslashreplace")}


async def _versions(args: argparse.Namespace) -> Listing:
    r = await _call(args, "ListVersions", pb.ListVersionsRequest(subject=args.subject),
                    pb.ListVersionsResponse)
    return Listing("versions", VERSION_COLUMNS, [
        {"version": v.version, "schema_id": v.schema_id, "created_at": v.created_at,
         "created_by": v.created_by, "description": v.description, "fingerprint": v.fingerprint}
        for v in r.versions], {"subject": args.subject})


async def _check(args: argparse.Namespace) -> dict[str, object]:
    request = pb.CheckCompatibilityRequest(subject=args.subject, new_schema_definition=_definition(args),
                                           schema_type=args.type)
    if args.mode is not None:
        request.compatibility_mode = args.mode
    r = await _call(args, "CheckCompatibility", request, pb.CheckCompatibilityResponse)
    if not r.is_compatible:
        raise AdminCallFailed("not compatible: " + "; ".join(r.errors))
    return {"subject": args.subject, "compatible": True}


async def _mode(args: argparse.Namespace) -> dict[str, object]:
    r = await _call(args, "SetCompatibilityMode", pb.SetCompatibilityModeRequest(
        subject=args.subject, compatibility_mode=args.mode), pb.SetCompatibilityModeResponse)
    if not r.success:
        raise AdminCallFailed(r.message or "the broker did not set the mode")
    return {"subject": args.subject, "compatibility_mode": args.mode}


async def _delete(args: argparse.Namespace) -> dict[str, object]:
    r = await _call(args, "DeleteSchemaVersion", pb.DeleteSchemaVersionRequest(
        subject=args.subject, version=args.version), pb.DeleteSchemaVersionResponse)
    if not r.success:
        raise AdminCallFailed(r.message or "the broker did not delete the version")
    return {"subject": args.subject, "deleted_version": args.version}


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("subject", metavar="SUBJECT")
    parser.add_argument("--addr", default=DEFAULT_ADDR, metavar="HOST:PORT",
                        help=f"a broker's client port (default: {DEFAULT_ADDR})")
    parser.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                        help="give up on a broker that does not answer after this long (default: 10)")
    parser.add_argument("--tls-ca", metavar="PEM", help="TLS: the CA that signed the broker's certificate")
    parser.add_argument("--tls-cert", metavar="PEM", help="mTLS: this client's certificate")
    parser.add_argument("--tls-key", metavar="PEM", help="mTLS: this client's key")
    parser.add_argument("--token", metavar="JWT", help="a bearer token (default: $DANUBE_TOKEN); implies TLS")


def _definition_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", required=True, type=str.lower, choices=TYPES, help="the schema type")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--file", metavar="PATH", help="the definition's file (Avro or JSON Schema, .proto)")
    given.add_argument("--definition", metavar="TEXT", help="the definition itself")


def add_parsers(commands: Subparsers, leaf: Leaf) -> None:
    """`schema register|get|versions|check|mode|delete`; `leaf` is main.py's."""
    schema = commands.add_parser("schema", help="the schema registry").add_subparsers(
        dest="action", required=True, metavar="ACTION")

    def command(name: str, run: Run, help_text: str) -> argparse.ArgumentParser:
        description = help_text[0].upper() + help_text[1:] + "."
        parser = leaf(schema, name, f"schema {name}", run, help_text, description)
        _options(parser)
        return parser

    r = command("register", _register, "register a definition as the subject's next version (or find it)")
    _definition_options(r)
    r.add_argument("--description", default="", help="a description of this version")
    r.add_argument("--created-by", default="", metavar="WHO", help="who registers it")
    r.add_argument("--tag", action="append", default=[], help="a tag (repeatable)")
    g = command("get", _get, "show a version of the subject (default: the latest) and its definition")
    g.add_argument("--version", type=count, metavar="N", help="this version instead of the latest")
    command("versions", _versions, "list the subject's versions")
    c = command("check", _check, "check a definition against the subject's latest version (exit 1: not "
                                 "compatible)")
    _definition_options(c)
    c.add_argument("--mode", choices=MODES, help="judge by this mode instead of the subject's")
    m = command("mode", _mode, "set the subject's compatibility mode")
    m.add_argument("mode", choices=MODES, metavar="MODE", help=", ".join(MODES))
    d = command("delete", _delete, "delete a version of the subject (never its only one)")
    d.add_argument("version", type=count, metavar="VERSION")
