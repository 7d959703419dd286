"""`danube-fast`: one command with a subcommand per area (`broker`; `produce` and `consume` in
cli/messages.py; `schema ...` in cli/schemas.py; `admin metadata backup|restore`; `admin
brokers|topics|cluster ...` in cli/admin.py; `admin namespaces ...` in cli/namespaces.py;
`admin subscriptions ...` in cli/subscriptions.py;
`admin security ...` in cli/security.py; `admin policies ...` in cli/policies.py; `admin tables ...` in
cli/tables.py). Every leaf sets `run`, an async function of the
parsed arguments that returns the summary to print (a dict of fields, an admin Listing of rows, or a bare
string such as a token), and `what`, the words its error line starts with.

Exit codes: 0 done; 2 a usage error (argparse's own, and a malformed store URL); 1 the command failed, with
one line on stderr naming what was wrong; 141 quietly when stdout's reader went away (`| head`), as `cat`
does; 130 interrupted. An unexpected exception (a bug) keeps its traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

from danube_fast.cli import admin as admin_cli
from danube_fast.cli import broker as broker_cli
from danube_fast.cli import feedback
from danube_fast.cli import messages as messages_cli
from danube_fast.cli import namespaces as namespaces_cli
from danube_fast.cli import policies as policies_cli
from danube_fast.cli import schemas as schemas_cli
from danube_fast.cli import security as security_cli
from danube_fast.cli import subscriptions as subscriptions_cli
from danube_fast.cli import tables as tables_cli
from danube_fast.cli.args import positive_float
from danube_fast.errors import DanubeError
from danube_fast.meta import backup
from danube_fast.meta.connect import (
    URL_FORMS,
    StoreUrl,
    StoreUrlError,
    check_access,
    open_store,
    parse_store_url,
)
from danube_fast.meta.etcd_access import ETCD_PASSWORD_ENV, EtcdAccess

PROG = "danube-fast"
EXIT_OK, EXIT_FAILED = 0, 1  # and 2, argparse's exit code for a usage error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141, as shells report a process that SIGPIPE ended

# The fields of EtcdAccess as the options below call them, for its messages.
ETCD_OPTIONS = {"ca_file": "--etcd-ca", "cert_file": "--etcd-cert", "key_file": "--etcd-key",
                "user": "--etcd-user", "password_file": "--etcd-password-file"}
Summary = dict[str, object]
Handler = Callable[[argparse.Namespace], Awaitable[Summary | admin_cli.Listing | str]]


def _version() -> str:
    """The installed distribution's version (pyproject.toml), or "unknown" when run from a bare checkout."""
    try:
        return importlib.metadata.version("danube-fast")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _store_url(text: str) -> StoreUrl:
    try:
        return parse_store_url(text)
    except StoreUrlError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _leaf(parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str, what: str, run: Handler,
          help_text: str, description: str) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=help_text, description=description)
    parser.set_defaults(run=run, what=what)
    parser.add_argument("--output", choices=("table", "json"), default="table",
                        help="how to print the summary on stdout (default: table)")
    return parser


def _store_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--store", type=_store_url, required=True, metavar="STORE",
                        help=f"{help_text}: {URL_FORMS}")
    parser.add_argument("--timeout", type=positive_float, default=5.0, metavar="SECONDS",
                        help="give up on an unreachable etcd after this long (default: 5)")
    etcd = parser.add_argument_group(
        "etcd over TLS with authentication (docs/SECURITY.md)",
        "TLS is on with --etcd-ca or --etcd-cert, or when an endpoint is written https://host:port.")
    etcd.add_argument("--etcd-ca", metavar="PEM", default="",
                      help="the CA that signed etcd's certificate (default with https://: the system's CAs)")
    etcd.add_argument("--etcd-cert", metavar="PEM", default="",
                      help="a client certificate for etcd's --client-cert-auth (with --etcd-key)")
    etcd.add_argument("--etcd-key", metavar="PEM", default="", help="the client certificate's key")
    etcd.add_argument("--etcd-user", metavar="NAME", default="",
                      help=f"log in to etcd as this user; its password from --etcd-password-file or the "
                           f"environment variable {ETCD_PASSWORD_ENV}")
    etcd.add_argument("--etcd-password-file", metavar="FILE", default="",
                      help="a file holding the user's password (one line)")


def _etcd_access(args: argparse.Namespace) -> EtcdAccess:
    access = EtcdAccess(ca_file=args.etcd_ca, cert_file=args.etcd_cert, key_file=args.etcd_key,
                        user=args.etcd_user, password_file=args.etcd_password_file)
    check_access(args.store, access)
    access.check(ETCD_OPTIONS)
    access.resolve_password(names=ETCD_OPTIONS)  # a user without a password is named in these words
    return access


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="A Danube-compatible messaging broker.")
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker_cli.add_parser(commands)
    messages_cli.add_parsers(commands, _leaf)
    schemas_cli.add_parsers(commands, _leaf)
    admin = commands.add_parser("admin", help="administer a cluster").add_subparsers(
        dest="area", required=True, metavar="AREA")
    metadata = admin.add_parser("metadata", help="back up and restore the cluster metadata").add_subparsers(
        dest="action", required=True, metavar="ACTION")

    b = _leaf(metadata, "backup", "metadata backup", _backup, "write every metadata key to FILE",
              "Write every key of the metadata store, read at one revision, to FILE (replaced "
              "atomically).")
    b.add_argument("file", metavar="FILE")
    _store_option(b, "the store to read")

    r = _leaf(metadata, "restore", "metadata restore", _restore,
              "write the keys of a backup FILE into an empty store",
              "Write the keys of a backup FILE into an empty metadata store. The file is checked whole "
              "before anything is written.")
    r.add_argument("file", metavar="FILE")
    _store_option(r, "the store to write; it must hold no key (an embedded file is created if missing)")
    r.add_argument("--skip-ephemeral", action=argparse.BooleanOptionalAction, default=True,
                   help="leave out keys that were under a lease (broker registrations, the leader key): "
                        "without their lease they would never expire and would describe brokers that are "
                        "gone (default: skip; --no-skip-ephemeral writes them without a lease)")
    admin_cli.add_parsers(admin, _leaf)
    namespaces_cli.add_parsers(admin, _leaf)
    subscriptions_cli.add_parsers(admin, _leaf)
    security_cli.add_parsers(admin, _leaf)
    policies_cli.add_parsers(admin, _leaf)
    tables_cli.add_parsers(admin, _leaf)
    return parser


async def _backup(args: argparse.Namespace) -> Summary:
    store = await open_store(args.store, access=_etcd_access(args), create=False, timeout=args.timeout)
    try:
        return (await feedback.waiting("reading and writing every key", backup.backup(store, args.file))
                ).as_json()
    finally:
        await store.close()


async def _restore(args: argparse.Namespace) -> Summary:
    source = await backup.load(args.file)  # first: a bad file must not create an embedded store
    store = await open_store(args.store, access=_etcd_access(args), create=True, timeout=args.timeout)
    shown = feedback.bar(len(source.entries), "key")
    try:
        return (await backup.restore(store, source, skip_ephemeral=args.skip_ephemeral,
                                     on_written=shown.update)).as_json()
    finally:
        shown.close()
        await store.close()


def _table(summary: Summary) -> str:
    width = max((len(name) for name in summary), default=0)
    lines = []
    for name, value in summary.items():
        if isinstance(value, list):
            value = f"{len(value)}" + (f": {', '.join(map(str, value))}" if value else "")
        lines.append(f"{name.ljust(width)}  {value}")
    return "\n".join(lines)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)  # exits 2 on a usage error
    # argparse gives a `nargs="*"` positional only the words before the first option: the ones after it
    # (`produce /ns/t --key k one two`) come back here, and belong to it.
    trailing = getattr(args, "trailing", None)
    if trailing is not None and extra and not any(word.startswith("-") for word in extra):
        getattr(args, trailing).extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "broker":
        return broker_cli.run(args)
    try:
        summary = asyncio.run(args.run(args))
        # Commands whose stdout carries data (consume's messages) report on stderr.
        out = sys.stderr if getattr(args, "summary_on_stderr", False) else sys.stdout
        if isinstance(summary, str):  # a value meant for a shell variable (a token)
            print(summary, file=out)
        elif isinstance(summary, admin_cli.Listing):
            print(json.dumps(summary.as_json()) if args.output == "json" else summary.as_table(), file=out)
        else:
            print(json.dumps(summary) if args.output == "json" else _table(summary), file=out)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of stdout went away (`consume ... | head`): done, quietly
        return _stdout_closed()
    except (DanubeError, OSError) as e:
        print(f"{PROG}: {args.what} failed: {_one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{PROG}: {args.what} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _stdout_closed() -> int:
    """End as `cat` and `grep` do when their stdout's reader is gone: no message, the status of a process
    SIGPIPE ended. Python would flush stdout again at exit and fail once more: point it at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
