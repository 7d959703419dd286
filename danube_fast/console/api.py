"""The console's JSON endpoints (docs/CONSOLE.md, "Endpoints"): each answers one page's question with admin
API calls made as the signed-in user (calls.py); live figures (rates, backlog, history) come from every
broker through BrokerStats, so any broker's console shows the whole cluster.

Reads are GETs; every change is a POST or DELETE that must carry the session's CSRF token in
`X-CSRF-Token` (server.py checks it before a handler runs). A refusal of the broker comes back as
`{"error": {"code", "message"}}` with the HTTP status of its code, so a page the user may not see says so.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from danube_fast.client.rpc import M, WireMessage
from danube_fast.console.calls import AdminCalls
from danube_fast.console.sessions import Session
from danube_fast.console.values import Decoder
from danube_fast.errors import ApiError
from danube_fast.names import partition_base
from danube_fast.proto import BrokerStats_pb2 as stats_pb
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import SchemaRegistry_pb2 as schema_pb
from danube_fast.proto import SecurityAdmin_pb2 as security_pb
from danube_fast.proto import SubscriptionAdmin_pb2 as subs_pb
from danube_fast.proto import TableAdmin_pb2 as table_pb
from danube_fast.schema.registry import SchemaRegistry

MAX_BROWSE = 1000
STATUS = {"INVALID_ARGUMENT": 400, "OUT_OF_RANGE": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403,
          "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "FAILED_PRECONDITION": 409, "ABORTED": 409,
          "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
Handler = Callable[[web.Request, Session], Awaitable[Any]]


def refusal(code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=STATUS.get(code, 500))


def bad(message: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", message)


class Api:
    def __init__(self, calls: AdminCalls, registry: SchemaRegistry) -> None:
        self._calls = calls
        self._registry = registry

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/api/overview", self.overview),
            ("POST", "/api/namespaces", self.create_namespace),
            ("DELETE", "/api/namespaces", self.delete_namespace),
            ("GET", "/api/topics", self.topics),
            ("POST", "/api/topics", self.create_topic),
            ("DELETE", "/api/topics", self.delete_topic),
            ("GET", "/api/topic", self.topic),
            ("POST", "/api/topics/unload", self.unload_topic),
            ("POST", "/api/subscriptions/seek", self.seek),
            ("POST", "/api/subscriptions/skip", self.skip),
            ("DELETE", "/api/subscriptions", self.unsubscribe),
            ("GET", "/api/records", self.records),
            ("GET", "/api/records/value", self.record_value),
            ("GET", "/api/schemas", self.schemas),
            ("GET", "/api/schema", self.schema),
            ("POST", "/api/schema/check", self.check_schema),
            ("POST", "/api/schema/mode", self.set_mode),
            ("GET", "/api/security", self.security),
            ("POST", "/api/security/roles", self.put_role),
            ("DELETE", "/api/security/roles", self.delete_role),
            ("POST", "/api/security/bindings", self.bind),
            ("DELETE", "/api/security/bindings", self.unbind),
        ]

    async def _call(self, session: Session, service: str, method: str, request: WireMessage,
                    reply: type[M]) -> M:
        return await self._calls.call(service, method, request, reply, session.token)

    async def _part(self, session: Session, service: str, method: str, request: WireMessage,
                    reply: type[M], shown: Callable[[M], Any]) -> Any:
        """One section of a page: its data, or the refusal that section gets (the rest still shows)."""
        try:
            return shown(await self._call(session, service, method, request, reply))
        except ApiError as e:
            return {"error": {"code": e.grpc_code, "message": str(e)}}

    # -- overview --------------------------------------------------------------------------------------

    async def overview(self, request: web.Request, session: Session) -> Any:
        empty = admin_pb.Empty()
        brokers = await self._part(session, "BrokerAdmin", "ListBrokers", empty, admin_pb.BrokerListResponse,
                                   _brokers)
        leader = await self._part(session, "BrokerAdmin", "GetLeaderBroker", empty, admin_pb.BrokerResponse,
                                  lambda r: r.leader)
        balance = await self._part(session, "BrokerAdmin", "GetClusterBalance",
                                   admin_pb.ClusterBalanceRequest(), admin_pb.ClusterBalanceResponse,
                                   lambda r: {str(b.broker_id): {"load": b.load, "topics": b.topic_count}
                                              for b in r.brokers})
        namespaces = await self._part(session, "BrokerAdmin", "ListNamespaces", empty,
                                      admin_pb.NamespaceListResponse, lambda r: sorted(r.namespaces))
        figures = await self._part(session, "BrokerStats", "Figures",
                                   stats_pb.FiguresRequest(no_topics=True), stats_pb.FiguresResponse,
                                   _cluster_figures)
        return {"brokers": brokers, "leader": leader, "balance": balance, "namespaces": namespaces,
                "figures": figures}

    async def _topic_figures(self, session: Session, stored_topics: list[str] | None = None
                             ) -> dict[str, stats_pb.TopicFigures]:
        """Each stored topic's figures from the broker serving it; none for what the user may not see."""
        try:
            answer = await self._call(session, "BrokerStats", "Figures",
                                      stats_pb.FiguresRequest(topics=stored_topics or []),
                                      stats_pb.FiguresResponse)
        except ApiError:
            return {}
        return {t.stored_topic: t for b in answer.brokers for t in b.topics}

    # -- namespaces ------------------------------------------------------------------------------------

    async def create_namespace(self, request: web.Request, session: Session) -> Any:
        name = text_field(await read_body(request), "name")
        await self._call(session, "NamespaceAdmin", "CreateNamespace", admin_pb.NamespaceRequest(name=name),
                         admin_pb.NamespaceResponse)
        return {"created": name}

    async def delete_namespace(self, request: web.Request, session: Session) -> Any:
        name = _query(request, "name")
        await self._call(session, "NamespaceAdmin", "DeleteNamespace", admin_pb.NamespaceRequest(name=name),
                         admin_pb.NamespaceResponse)
        return {"deleted": name}

    # -- topics ----------------------------------------------------------------------------------------

    async def topics(self, request: web.Request, session: Session) -> Any:
        names = await self._call(session, "BrokerAdmin", "ListNamespaces", admin_pb.Empty(),
                                 admin_pb.NamespaceListResponse)
        rows: dict[str, dict[str, Any]] = {}
        refused: dict[str, str] = {}
        figures = await self._topic_figures(session)
        for ns in sorted(names.namespaces):
            try:
                listed = await self._call(session, "TopicAdmin", "ListNamespaceTopics",
                                          admin_pb.NamespaceRequest(name=ns), admin_pb.TopicInfoListResponse)
            except ApiError as e:
                refused[ns] = str(e)
                continue
            for info in listed.topics:
                _add_row(rows, info, figures.get(info.name))
        return {"topics": sorted(rows.values(), key=lambda r: r["name"]), "refused": refused}

    async def create_topic(self, request: web.Request, session: Session) -> Any:
        body = await read_body(request)
        name = text_field(body, "name")
        reliable = body.get("delivery", "Reliable") != "NonReliable"
        strategy = admin_pb.Reliable if reliable else admin_pb.NonReliable
        partitions = body.get("partitions") or 0
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 0 <= partitions <= 1024:
            raise bad(f"partitions must be a whole number from 0 to 1024, not {partitions!r}")
        if partitions:
            await self._call(session, "TopicAdmin", "CreatePartitionedTopic",
                             admin_pb.PartitionedTopicRequest(base_name=name, partitions=partitions,
                                                              dispatch_strategy=strategy),
                             admin_pb.TopicResponse)
        else:
            await self._call(session, "TopicAdmin", "CreateTopic",
                             admin_pb.NewTopicRequest(name=name, dispatch_strategy=strategy),
                             admin_pb.TopicResponse)
        return {"created": name}

    async def delete_topic(self, request: web.Request, session: Session) -> Any:
        name = _query(request, "name")
        await self._call(session, "TopicAdmin", "DeleteTopic", admin_pb.TopicRequest(name=name),
                         admin_pb.TopicResponse)
        return {"deleted": name}

    async def unload_topic(self, request: web.Request, session: Session) -> Any:
        """A stored topic leaves its broker; in a cluster the load manager places it on another."""
        name = text_field(await read_body(request), "name")
        await self._call(session, "TopicAdmin", "UnloadTopic", admin_pb.TopicRequest(name=name),
                         admin_pb.TopicResponse)
        return {"unloaded": name}

    async def topic(self, request: web.Request, session: Session) -> Any:
        name = _query(request, "name")
        ns = name.split("/")[1] if name.count("/") == 2 else ""
        listed = await self._call(session, "TopicAdmin", "ListNamespaceTopics",
                                  admin_pb.NamespaceRequest(name=ns), admin_pb.TopicInfoListResponse)
        short = name.rsplit("/", 1)[-1]
        parts = [t for t in listed.topics if t.name == name or
                 (t.name.startswith(name + "-part-") and partition_base(t.name.rsplit("/", 1)[-1]) == short)]
        if not parts:
            raise ApiError("NOT_FOUND", f"topic {name} does not exist (as a topic or as a partitioned topic)")
        figures = await self._topic_figures(session, [t.name for t in parts])
        partitions = []
        for info in sorted(parts, key=lambda t: t.name):
            described = await self._part(session, "TopicAdmin", "DescribeTopic",
                                         admin_pb.DescribeTopicRequest(name=info.name),
                                         admin_pb.DescribeTopicResponse, _described)
            f = figures.get(info.name)
            reliable = f if f is not None and info.delivery == "Reliable" else None
            partitions.append({
                "name": info.name, "broker_id": info.broker_id, "delivery": info.delivery, **described,
                "producers": list(f.producers) if f is not None else None,
                "start_offset": reliable.start_offset if reliable is not None else None,
                "end_offset": reliable.end_offset if reliable is not None else None,
            })
        subscriptions = await self._part(
            session, "SubscriptionAdmin", "List", subs_pb.ListRequest(topic=name), subs_pb.DescribeResponse,
            lambda r: [{"stored_topic": s.stored_topic, "name": s.subscription, "type": s.type,
                        "position": s.position, "end_offset": s.end_offset, "backlog": s.backlog,
                        "unacked": s.unacked, "served_by": s.served_by, "delayed": s.delayed,
                        "consumers": [{"name": c.name, "active": c.active} for c in s.consumers]}
                       for s in r.partitions])
        policy = await self._part(session, "PolicyAdmin", "GetTopicPolicy",
                                  policy_pb.TopicPolicyRequest(topic=name), policy_pb.PolicyView,
                                  lambda r: {"policy": json.loads(r.policy or "{}"), "own": r.own})
        try:
            table: Any = [_table(t) for t in (await self._call(
                session, "TableAdmin", "Status", table_pb.TableStatusRequest(topic=name),
                table_pb.TableStatusResponse)).tables]
        except ApiError as e:
            table = None if e.grpc_code == "FAILED_PRECONDITION" else \
                {"error": {"code": e.grpc_code, "message": str(e)}}
        return {"name": name, "partitions": partitions, "subscriptions": subscriptions, "policy": policy,
                "table": table}

    # -- subscriptions ---------------------------------------------------------------------------------

    async def seek(self, request: web.Request, session: Session) -> Any:
        body = await read_body(request)
        seek = subs_pb.SeekRequest(topic=text_field(body, "topic"),
                                   subscription=text_field(body, "subscription"),
                                   dry_run=bool(body.get("dry_run")))
        to = body.get("to")
        if not isinstance(to, dict) or len(to) != 1:
            raise bad("seek needs `to`: one of offset, time_ms, earliest, latest or shift")
        (which, value), = to.items()
        if which in ("offset", "time_ms", "shift"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(f"{which} must be a whole number, not {value!r}")
            setattr(seek, which, value)
        elif which in ("earliest", "latest"):
            setattr(seek, which, True)
        else:
            raise bad(f"unknown seek target {which!r} (offset, time_ms, earliest, latest or shift)")
        answer = await self._call(session, "SubscriptionAdmin", "Seek", seek, subs_pb.PositionsResponse)
        return {"positions": [_position(p) for p in answer.positions]}

    async def skip(self, request: web.Request, session: Session) -> Any:
        body = await read_body(request)
        skip = subs_pb.SkipRequest(topic=text_field(body, "topic"),
                                   subscription=text_field(body, "subscription"),
                                   dry_run=bool(body.get("dry_run")))
        if body.get("all"):
            skip.all = True
        else:
            count = body.get("count")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise bad(f"skip needs a count of records (a whole number of 1 or more) or all, "
                          f"not {count!r}")
            skip.records = count
        answer = await self._call(session, "SubscriptionAdmin", "Skip", skip, subs_pb.PositionsResponse)
        return {"positions": [_position(p) for p in answer.positions]}

    async def unsubscribe(self, request: web.Request, session: Session) -> Any:
        topic, sub = _query(request, "topic"), _query(request, "subscription")
        await self._call(session, "TopicAdmin", "Unsubscribe",
                         admin_pb.SubscriptionRequest(topic=topic, subscription=sub),
                         admin_pb.SubscriptionResponse)
        return {"deleted": sub}

    # -- records ---------------------------------------------------------------------------------------

    def _browse_request(self, request: web.Request) -> subs_pb.BrowseRequest:
        q = request.query
        browse = subs_pb.BrowseRequest(topic=_query(request, "topic"), backward=q.get("backward") == "1")
        count = _int(q.get("count", "20"), "count")
        if not 1 <= count <= MAX_BROWSE:
            raise bad(f"count must be 1 to {MAX_BROWSE}, not {count}")
        browse.count = count
        start = q.get("from", "earliest")
        kind, _, value = start.partition(":")
        if kind == "offset":
            browse.offset = _int(value, "offset")
        elif kind == "time":
            browse.time_ms = _int(value, "time (ms since the epoch)")
        elif kind in ("earliest", "latest") and not value:
            setattr(browse, kind, True)
        else:
            raise bad(f"from must be offset:N, time:MS, earliest or latest, not {start!r}")
        return browse

    async def records(self, request: web.Request, session: Session) -> Any:
        answer = await self._call(session, "SubscriptionAdmin", "Browse", self._browse_request(request),
                                  subs_pb.BrowseResponse)

        async def lookup(schema_id: int, version: int | None) -> tuple[str, bytes]:
            got = await self._call(session, "SchemaRegistry", "GetSchema",
                                   schema_pb.GetSchemaRequest(schema_id=schema_id, version=version),
                                   schema_pb.GetSchemaResponse)
            return got.schema_type, got.schema_definition

        decoder = Decoder(lookup)
        return {"records": [await decoder.record(r) for r in answer.records],
                "ranges": [{"stored_topic": r.stored_topic, "start_offset": r.start_offset,
                            "end_offset": r.end_offset} for r in answer.ranges]}

    async def record_value(self, request: web.Request, session: Session) -> web.Response:
        topic = _query(request, "topic")
        offset = _int(_query(request, "offset"), "offset")
        answer = await self._call(session, "SubscriptionAdmin", "Browse",
                                  subs_pb.BrowseRequest(topic=topic, offset=offset, count=1),
                                  subs_pb.BrowseResponse)
        found = [r for r in answer.records if r.offset == offset]
        if not found:
            raise ApiError("NOT_FOUND", f"{topic} holds no record at offset {offset}")
        return web.Response(body=found[0].payload, content_type="application/octet-stream", headers={
            "Content-Disposition": f'attachment; filename="record-{offset}.bin"'})

    # -- schemas ---------------------------------------------------------------------------------------

    async def schemas(self, request: web.Request, session: Session) -> Any:
        # Subjects are cluster-wide and need Lookup on the cluster, as the registry's reads do: that
        # call is made first, as the user, so a user who may not read schemas is refused here too.
        await self._call(session, "BrokerAdmin", "GetLeaderBroker", admin_pb.Empty(), admin_pb.BrokerResponse)
        out = []
        for subject in await self._registry.subjects():
            latest = await self._part(session, "SchemaRegistry", "GetLatestSchema",
                                      schema_pb.GetLatestSchemaRequest(subject=subject),
                                      schema_pb.GetSchemaResponse,
                                      _latest)
            out.append({"subject": subject, **latest})
        return {"subjects": out}

    async def schema(self, request: web.Request, session: Session) -> Any:
        subject = _query(request, "subject")
        versions = await self._call(session, "SchemaRegistry", "ListVersions",
                                    schema_pb.ListVersionsRequest(subject=subject),
                                    schema_pb.ListVersionsResponse)
        out = []
        mode = ""
        for v in versions.versions:
            got = await self._call(session, "SchemaRegistry", "GetSchema",
                                   schema_pb.GetSchemaRequest(schema_id=v.schema_id, version=v.version),
                                   schema_pb.GetSchemaResponse)
            mode = got.compatibility_mode or mode
            out.append({"version": v.version, "schema_id": v.schema_id, "created_at": v.created_at,
                        "created_by": v.created_by, "description": v.description,
                        "fingerprint": v.fingerprint,
                        "type": got.schema_type,
                        "definition": got.schema_definition.decode("utf-8", "replace")})
        return {"subject": subject, "compatibility": mode, "versions": out}

    async def check_schema(self, request: web.Request, session: Session) -> Any:
        body = await read_body(request)
        answer = await self._call(session, "SchemaRegistry", "CheckCompatibility",
                                  schema_pb.CheckCompatibilityRequest(
                                      subject=text_field(body, "subject"),
                                      schema_type=text_field(body, "type"),
                                      new_schema_definition=text_field(body, "definition").encode()),
                                  schema_pb.CheckCompatibilityResponse)
        return {"compatible": answer.is_compatible, "errors": list(answer.errors)}

    async def set_mode(self, request: web.Request, session: Session) -> Any:
        body = await read_body(request)
        change = schema_pb.SetCompatibilityModeRequest(subject=text_field(body, "subject"),
                                                       compatibility_mode=text_field(body, "mode"))
        answer = await self._call(session, "SchemaRegistry", "SetCompatibilityMode", change,
                                  schema_pb.SetCompatibilityModeResponse)
        return {"set": answer.success, "message": answer.message}

    # -- security --------------------------------------------------------------------------------------

    async def security(self, request: web.Request, session: Session) -> Any:
        roles = await self._call(session, "SecurityAdmin", "ListRoles", security_pb.ListRolesRequest(),
                                 security_pb.RoleList)
        bindings = await self._call(session, "SecurityAdmin", "ListBindings",
                                    security_pb.ListBindingsRequest(), security_pb.BindingList)
        return {"roles": [{"name": r.name, "permissions": list(r.permissions)} for r in roles.roles],
                "bindings": [{"principal": b.principal, "role": b.role, "scope": b.scope}
                             for b in bindings.bindings]}

    async def put_role(self, request: web.Request, session: Session) -> Any:
        body = await read_body(request)
        permissions = body.get("permissions")
        if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
            raise bad("permissions must be a list of permission names")
        role = security_pb.Role(name=text_field(body, "name"), permissions=permissions)
        answer = await self._call(session, "SecurityAdmin", "PutRole", role, security_pb.Role)
        return {"name": answer.name, "permissions": list(answer.permissions)}

    async def delete_role(self, request: web.Request, session: Session) -> Any:
        answer = await self._call(session, "SecurityAdmin", "DeleteRole",
                                  security_pb.RoleRequest(name=_query(request, "name")), security_pb.Deleted)
        return {"existed": answer.existed}

    async def bind(self, request: web.Request, session: Session) -> Any:
        body = await read_body(request)
        binding = security_pb.Binding(principal=text_field(body, "principal"), role=text_field(body, "role"),
                                      scope=text_field(body, "scope"))
        await self._call(session, "SecurityAdmin", "Bind", binding, security_pb.Binding)
        return {"bound": True}

    async def unbind(self, request: web.Request, session: Session) -> Any:
        binding = security_pb.Binding(principal=_query(request, "principal"), role=_query(request, "role"),
                                      scope=_query(request, "scope"))
        answer = await self._call(session, "SecurityAdmin", "Unbind", binding, security_pb.Deleted)
        return {"existed": answer.existed}


def _add_row(rows: dict[str, dict[str, Any]], info: admin_pb.TopicInfo,
             f: stats_pb.TopicFigures | None) -> None:
    """The listing's row of `info`'s topic (a partition adds to its base name's row) with its figures."""
    base_short = partition_base(info.name.rsplit("/", 1)[-1])
    name = info.name if base_short is None else info.name.rsplit("/", 1)[0] + "/" + base_short
    row = rows.get(name)
    if row is None:
        row = rows[name] = {"name": name, "namespace": name.split("/")[1], "delivery": info.delivery,
                            "partitions": 0, "brokers": [], "messages_in_rate": 0.0,
                            "bytes_in_rate": 0.0, "messages_out_rate": 0.0, "backlog": 0,
                            "subscriptions": 0, "retained_bytes": 0, "retained_records": 0, "wal_bytes": 0,
                            "table": None, "figures_from": 0, "stored": 0}
    row["stored"] += 1
    if base_short is not None:
        row["partitions"] += 1
    if info.broker_id not in row["brokers"]:
        row["brokers"].append(info.broker_id)
    if f is None:
        return  # its owner did not answer, is moving it, or the user may not see figures
    row["figures_from"] += 1
    row["messages_in_rate"] += f.messages_in_rate
    row["bytes_in_rate"] += f.bytes_in_rate
    row["messages_out_rate"] += f.messages_out_rate
    row["subscriptions"] += f.subscriptions
    row["backlog"] += f.backlog
    row["retained_bytes"] += f.retained_bytes
    row["retained_records"] += f.retained_records
    row["wal_bytes"] += f.wal_bytes
    if f.table:
        row["table"] = f.table


def _cluster_figures(r: stats_pb.FiguresResponse) -> dict[str, Any]:
    """Every broker's totals and history summed (points in the same period add up), and the brokers that
    did not answer."""
    totals = dict.fromkeys(("messages_in", "bytes_in", "messages_out", "bytes_out"), 0)
    points: dict[int, dict[str, float]] = {}
    period = max((b.period_s for b in r.brokers if not b.error), default=10.0) or 10.0
    for b in r.brokers:
        if b.error:
            continue
        for key in totals:
            totals[key] += getattr(b, key)
        for p in b.history:
            bucket = points.setdefault(int(p.time // period), dict.fromkeys(totals, 0.0))
            for key in totals:
                bucket[key] += getattr(p, key)
    return {"totals": totals, "period_s": period, "brokers": len(r.brokers),
            "missing": {b.broker_id: b.error for b in r.brokers if b.error},
            "history": [{"time": (k + 1) * period, **v} for k, v in sorted(points.items())]}


def _brokers(r: admin_pb.BrokerListResponse) -> list[dict[str, str]]:
    return [{"id": b.broker_id, "addr": b.broker_addr, "role": b.broker_role, "admin_addr": b.admin_addr,
             "status": b.broker_status} for b in r.brokers]


def _latest(r: schema_pb.GetSchemaResponse) -> dict[str, Any]:
    return {"schema_id": r.schema_id, "version": r.version, "type": r.schema_type,
            "compatibility": r.compatibility_mode}


def _described(r: admin_pb.DescribeTopicResponse) -> dict[str, Any]:
    return {"schema_subject": r.schema_subject if r.HasField("schema_subject") else None,
            "schema_type": r.schema_type if r.HasField("schema_type") else None,
            "schema_version": r.schema_version if r.HasField("schema_version") else None,
            "compatibility": r.compatibility_mode if r.HasField("compatibility_mode") else None}


def _position(p: subs_pb.Position) -> dict[str, Any]:
    return {"stored_topic": p.stored_topic, "from_offset": p.from_offset, "to_offset": p.to_offset,
            "records": p.records, "moved": p.moved}


def _table(t: table_pb.TableStatus) -> dict[str, Any]:
    return {"stored_topic": t.stored_topic, "mode": t.mode, "table": t.table,
            "committed_offset": t.committed_offset,
            "topic_offset": t.topic_offset, "lag_ms": t.lag_ms, "files": t.files, "bytes": t.bytes,
            "dlq_records": t.dlq_records, "partitioning": t.partitioning, "error": t.error,
            "stopped": t.stopped}


async def read_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def text_field(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise bad(f"{field} must be a non-empty string")
    return value


def _query(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if not value:
        raise bad(f"the query needs {name}")
    return value


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad(f"{what} must be a whole number, not {text[:40]!r}") from None
