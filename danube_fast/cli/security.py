"""`danube-fast admin security roles|bindings|tokens ...` (docs/SECURITY.md): the SecurityAdmin service of a
running broker, and token signing, which needs no broker.

    admin security roles put NAME --permission P [--permission P ...] | get NAME | list | delete NAME
    admin security bindings add|remove --principal P --role R --scope S | list [--principal P] [--scope S]
    admin security tokens create --sub P --ttl SECONDS --key-file FILE --issuer I --audience A
"""

from __future__ import annotations

import argparse

from danube_fast.cli.admin import Leaf, Listing, Run, Subparsers, call, connection_options
from danube_fast.cli.args import count
from danube_fast.errors import DanubeError
from danube_fast.proto import SecurityAdmin_pb2 as pb
from danube_fast.security.config import HMAC_ALGORITHMS, KEY_ALGORITHMS
from danube_fast.security.rbac import PERMISSIONS
from danube_fast.security.tokens import TokenRefused, read_secret, sign_token

SERVICE = pb.DESCRIPTOR.services_by_name["SecurityAdmin"].full_name
ROLE_COLUMNS = [("name", "ROLE"), ("permissions", "PERMISSIONS")]
BINDING_COLUMNS = [("principal", "PRINCIPAL"), ("role", "ROLE"), ("scope", "SCOPE")]


class TokenFailed(DanubeError):
    """A token could not be signed: the key file or the subject is not usable."""


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
        return {"token": token, "sub": args.sub, "expires_in": args.ttl}
    return token  # alone on its line: TOKEN=$(danube-fast admin security tokens create ...)


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
