"""`danube-fast admin security roles|bindings|tokens ...` (docs/SECURITY.md): the SecurityAdmin service of a
running broker, and token signing, which needs no broker.

    admin security roles put NAME --permission P [--permission P ...] | get NAME | list | delete NAME
    admin security bindings add|remove --principal P --role R --scope S | list [--principal P] [--scope S]
    admin security tokens create --sub P --ttl SECONDS --key-file FILE --issuer I --audience A
    admin security tokens revoke (--jti ID [--exp TIME] | --from-token TOKEN | --sub P [--before TIME|now])
    admin security tokens unrevoke (--jti ID | --sub P) | tokens revocations list

TIME is ISO 8601 with a time zone (2026-01-31T12:00:00Z) or seconds since the epoch. `--from-token` reads the
jti, exp and sub of a token without verifying it (a leaked token, pasted as found); it is not `--token`,
which every admin command takes for its own bearer token.
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import datetime

import jwt

from danube_fast.cli.admin import Leaf, Listing, Run, Subparsers, call, connection_options
from danube_fast.cli.args import count
from danube_fast.errors import DanubeError
from danube_fast.proto import SecurityAdmin_pb2 as pb
from danube_fast.security.config import HMAC_ALGORITHMS, KEY_ALGORITHMS
from danube_fast.security.rbac import PERMISSIONS
from danube_fast.security.revocation import iso
from danube_fast.security.tokens import TokenRefused, read_secret, sign_token

SERVICE = pb.DESCRIPTOR.services_by_name["SecurityAdmin"].full_name
ROLE_COLUMNS = [("name", "ROLE"), ("permissions", "PERMISSIONS")]
BINDING_COLUMNS = [("principal", "PRINCIPAL"), ("role", "ROLE"), ("scope", "SCOPE")]
REVOCATION_COLUMNS = [("kind", "KIND"), ("jti", "JTI"), ("sub", "SUB"), ("exp", "EXPIRES"),
                      ("before", "ISSUED BEFORE"), ("revoked_at", "REVOKED AT")]


class TokenFailed(DanubeError):
    """A token could not be signed: the key file or the subject is not usable."""


class RevokeFailed(DanubeError):
    """What to revoke is not clear: options that do not go together, or a token that cannot be read."""


def instant(text: str) -> float:
    """A time for --before and --exp: `now`, seconds since the epoch, or ISO 8601 with a time zone."""
    if text == "now":
        return time.time()
    if text.isascii() and text.isdigit():
        if len(text) > 12:  # past the year 33000: a typo, or milliseconds
            raise argparse.ArgumentTypeError(f"{text} is not a time in seconds since the epoch")
        return float(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 'now', seconds since the epoch or an ISO 8601 "
                                         "time (2026-01-31T12:00:00Z)") from None
    if when.tzinfo is None:  # a local time would move the cut by hours: refuse to guess
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone: add Z (UTC) or an offset such as "
                                         "+02:00")
    return when.timestamp()


def _seconds(when: float | None) -> int:
    """A time as a whole-second NumericDate, rounded up: a cut at 12:00:00.4 also takes tokens issued at
    12:00:00 (iat is whole seconds), and an expiry is kept rather than dropped early."""
    return 0 if when is None else max(1, math.ceil(when))


def _path(method: str) -> str:
    return f"/{SERVICE}/{method}"


def _role_row(role: pb.Role) -> dict[str, object]:
    return {"name": role.name, "permissions": ",".join(role.permissions)}


async def _roles_put(args: argparse.Namespace) -> dict[str, object]:
    role = await call(args, _path("PutRole"), pb.Role(name=args.name, permissions=args.permission), pb.Role)
    return {"role": role.name, "permissions": list(role.permissions)}


async def _roles_get(args: argparse.Namespace) -> dict[str, object]:
    role = await call(args, _path("GetRole"), pb.RoleRequest(name=args.name), pb.Role)
    return {"role": role.name, "permissions": list(role.permissions)}


async def _roles_list(args: argparse.Namespace) -> Listing:
    roles = await call(args, _path("ListRoles"), pb.ListRolesRequest(), pb.RoleList)
    return Listing("roles", ROLE_COLUMNS, [_role_row(r) for r in roles.roles])


async def _roles_delete(args: argparse.Namespace) -> dict[str, object]:
    answer = await call(args, _path("DeleteRole"), pb.RoleRequest(name=args.name), pb.Deleted)
    return {"role": args.name, "deleted": answer.existed}


def _binding(args: argparse.Namespace) -> pb.Binding:
    return pb.Binding(principal=args.principal, role=args.role, scope=args.scope)


async def _bindings_add(args: argparse.Namespace) -> dict[str, object]:
    b = await call(args, _path("Bind"), _binding(args), pb.Binding)
    return {"principal": b.principal, "role": b.role, "scope": b.scope}


async def _bindings_remove(args: argparse.Namespace) -> dict[str, object]:
    answer = await call(args, _path("Unbind"), _binding(args), pb.Deleted)
    return {"principal": args.principal, "role": args.role, "scope": args.scope, "removed": answer.existed}


async def _bindings_list(args: argparse.Namespace) -> Listing:
    request = pb.ListBindingsRequest(principal=args.principal or "", scope=args.scope or "")
    answer = await call(args, _path("ListBindings"), request, pb.BindingList)
    return Listing("bindings", BINDING_COLUMNS, [
        {"principal": b.principal, "role": b.role, "scope": b.scope} for b in answer.bindings])


async def _tokens_create(args: argparse.Namespace) -> str | dict[str, object]:
    try:
        if args.algorithm in HMAC_ALGORITHMS:
            key = read_secret(args.key_file)
        else:
            with open(args.key_file, "rb") as f:
                key = f.read()
        token = sign_token(key=key, algorithm=args.algorithm, subject=args.sub, issuer=args.issuer,
                           audience=args.audience, ttl_s=args.ttl, kid=args.kid)
    except (TokenRefused, ValueError) as e:
        raise TokenFailed(str(e)) from e
    except Exception as e:  # PyJWT and cryptography raise their own types for an unusable key
        raise TokenFailed(f"cannot sign with {args.key_file} ({args.algorithm}): {e}") from e
    if args.output == "json":
        claims = jwt.decode(token, options={"verify_signature": False})
        return {"token": token, "sub": args.sub, "expires_in": args.ttl, "jti": claims["jti"]}
    return token  # alone on its line: TOKEN=$(danube-fast admin security tokens create ...)


def _unverified_claims(token: str) -> dict[str, object]:
    """The claims of a token as written, without checking its signature or times (it is being revoked)."""
    try:
        claims: dict[str, object] = jwt.decode(token.strip(), options={"verify_signature": False})
    except jwt.PyJWTError as e:
        raise RevokeFailed(f"--from-token is not a readable JWT: {type(e).__name__}") from None
    return claims


def _revocation_row(r: pb.Revocation) -> dict[str, object]:
    return {"kind": "token" if r.jti else "subject", "jti": r.jti, "sub": r.sub,
            "exp": iso(r.exp) if r.exp else "", "before": iso(r.before) if r.before else "",
            "revoked_at": iso(r.revoked_at) if r.revoked_at else ""}


async def _tokens_revoke(args: argparse.Namespace) -> dict[str, object]:
    if args.exp is not None and not args.jti:
        raise RevokeFailed("--exp goes with --jti (--from-token reads the token's own)")
    if args.before is not None and not args.sub:
        raise RevokeFailed("--before goes with --sub")
    if args.sub:
        before = time.time() if args.before is None else args.before
        request = pb.RevokeSubjectRequest(sub=args.sub, before=_seconds(before))
        answer = await call(args, _path("RevokeSubject"), request, pb.Revocation)
    else:
        jti, exp, sub = args.jti, args.exp, None
        if args.from_token is not None:
            claims = _unverified_claims(args.from_token)
            jti, exp, sub = claims.get("jti"), claims.get("exp"), claims.get("sub")
            if not isinstance(jti, str) or not jti:
                raise RevokeFailed(f"the token has no jti: it can only be revoked with every token of its "
                                   f"subject issued before a time (--sub {sub} --before now)")
            if isinstance(exp, bool) or not isinstance(exp, int | float):
                exp = None
        request = pb.RevokeTokenRequest(jti=jti, exp=_seconds(exp), sub=sub if isinstance(sub, str) else "")
        answer = await call(args, _path("RevokeToken"), request, pb.Revocation)
    row = _revocation_row(answer)
    return {"revoked": row["kind"], **{k: v for k, v in row.items() if v and k != "kind"}}


async def _tokens_unrevoke(args: argparse.Namespace) -> dict[str, object]:
    answer = await call(args, _path("Unrevoke"), pb.UnrevokeRequest(jti=args.jti or "", sub=args.sub or ""),
                        pb.Deleted)
    return {("jti" if args.jti else "sub"): args.jti or args.sub, "removed": answer.existed}


async def _revocations_list(args: argparse.Namespace) -> Listing:
    answer = await call(args, _path("ListRevocations"), pb.ListRevocationsRequest(), pb.RevocationList)
    return Listing("revocations", REVOCATION_COLUMNS,
                   [_revocation_row(r) for r in [*answer.tokens, *answer.subjects]])


def add_parsers(admin: Subparsers, leaf: Leaf) -> None:
    security = admin.add_parser("security", help="roles, bindings and tokens").add_subparsers(
        dest="kind", required=True, metavar="KIND")

    def group(name: str, help_text: str) -> Subparsers:
        return security.add_parser(name, help=help_text).add_subparsers(dest="action", required=True,
                                                                       metavar="ACTION")

    def command(parent: Subparsers, name: str, what: str, run: Run, help_text: str,
                remote: bool = True) -> argparse.ArgumentParser:
        parser = leaf(parent, name, what, run, help_text, help_text[0].upper() + help_text[1:] + ".")
        if remote:
            connection_options(parser)
        return parser

    roles = group("roles", "roles: named sets of permissions")
    put = command(roles, "put", "security roles put", _roles_put, "create a role or replace its permissions")
    put.add_argument("name", metavar="NAME")
    put.add_argument("--permission", action="append", required=True, choices=sorted(PERMISSIONS),
                     help="a permission of the role (repeatable)")
    for name, run, text in (("get", _roles_get, "show a role"), ("delete", _roles_delete,
                                                                  "delete a role that is not bound")):
        command(roles, name, f"security roles {name}", run, text).add_argument("name", metavar="NAME")
    command(roles, "list", "security roles list", _roles_list, "list the roles")

    bindings = group("bindings", "who holds which role where")
    for name, run, text in (("add", _bindings_add, "give a principal a role at a scope"),
                            ("remove", _bindings_remove, "take a role at a scope from a principal")):
        b = command(bindings, name, f"security bindings {name}", run, text)
        b.add_argument("--principal", required=True, help="a token's sub, or cert:<CN> of a certificate")
        b.add_argument("--role", required=True)
        b.add_argument("--scope", required=True, help="cluster, /namespace or /namespace/topic")
    ls = command(bindings, "list", "security bindings list", _bindings_list, "list bindings")
    ls.add_argument("--principal", help="only this principal's")
    ls.add_argument("--scope", help="only at this scope")

    tokens = group("tokens", "sign bearer tokens (locally, with the broker's key)")
    t = command(tokens, "create", "security tokens create", _tokens_create,
                "sign a JWT for a principal (printed alone, or as JSON with --output json)", remote=False)
    t.add_argument("--sub", required=True, help="the principal the token names")
    t.add_argument("--ttl", type=count, required=True, metavar="SECONDS", help="how long it is valid")
    t.add_argument("--key-file", required=True, help="the HMAC secret, or the PEM private key")
    t.add_argument("--algorithm", default="HS256", choices=HMAC_ALGORITHMS + KEY_ALGORITHMS)
    t.add_argument("--issuer", required=True, help="the broker's jwt_issuer")
    t.add_argument("--audience", required=True, help="the broker's jwt_audience")
    t.add_argument("--kid", help="the key id (for a broker with a JWKS)")

    r = command(tokens, "revoke", "security tokens revoke", _tokens_revoke,
                "refuse a token before it expires: by its jti, or every token of a principal issued before "
                "a time; applies on every broker within a second or two")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--jti", help="the id of the token to refuse")
    which.add_argument("--from-token", metavar="TOKEN",
                       help="the token to refuse, as found: its jti, exp and sub are read, unverified "
                            "(--token stays the caller's own)")
    which.add_argument("--sub", help="a principal: refuse its tokens issued before --before")
    r.add_argument("--exp", type=instant, metavar="TIME",
                   help="with --jti: the token's expiry, after which the entry is dropped (default: kept "
                        "until unrevoked)")
    r.add_argument("--before", type=instant, metavar="TIME",
                   help="with --sub: refuse the tokens issued before this (and those without iat); "
                        "default: now. TIME: now, seconds since the epoch, or ISO 8601 with a time zone "
                        "(2026-01-31T12:00:00Z)")
    u = command(tokens, "unrevoke", "security tokens unrevoke", _tokens_unrevoke,
                "remove an entry of the deny list")
    gone = u.add_mutually_exclusive_group(required=True)
    gone.add_argument("--jti", help="the entry of this token id")
    gone.add_argument("--sub", help="the entry of this principal")
    revocations = tokens.add_parser("revocations", help="the deny list of tokens").add_subparsers(
        dest="revocations_action", required=True, metavar="ACTION")
    command(revocations, "list", "security tokens revocations list", _revocations_list,
            "list the revoked token ids (expired ones are dropped) and principals")
