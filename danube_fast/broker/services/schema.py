"""danube_schema.SchemaRegistry, served on the client port and on the admin port (docs/WIRE.md A.3, B.11,
C.13).

The registry's semantics live in danube_fast.schema; this module maps requests to it and its errors to the
status codes of C.13's table:

| RPC | failure | status |
|---|---|---|
| RegisterSchema | any (bad type or definition, incompatible, bad subject name) | INTERNAL |
| GetSchema | unknown id or version | NOT_FOUND `Schema not found for ID: <id>` |
| GetLatestSchema, ListVersions | unknown subject | NOT_FOUND `Schema not found for subject: <s>` |
| CheckCompatibility | unknown subject, bad definition | INTERNAL (a bad mode override: INVALID_ARGUMENT) |
| SetCompatibilityMode | bad mode / anything else | INVALID_ARGUMENT / INTERNAL |
| DeleteSchemaVersion | any | INTERNAL |
| ConfigureTopicSchema | bad policy / unknown subject, topic not served here | INVALID_ARGUMENT / NOT_FOUND |
| UpdateTopicValidationPolicy | bad policy / topic not served here | INVALID_ARGUMENT / NOT_FOUND |
| UpdateTopicValidationPolicy | the topic has no subject | FAILED_PRECONDITION |
| GetTopicSchemaConfig | topic not served here | NOT_FOUND |

Errors of the metadata store itself (unreachable, corrupt values) keep their own codes. GetSchema and
GetLatestSchema answer the definition as registered, not v0.7.3's wrapped enum: see danube_fast.schema.
"""

from __future__ import annotations

from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.topic import Topic
from danube_fast.errors import ApiError, not_found
from danube_fast.meta.store import BadValue
from danube_fast.names import check_name, clip
from danube_fast.proto import SchemaRegistry_pb2 as pb
from danube_fast.proto import SchemaRegistry_pb2_grpc as pb_grpc
from danube_fast.schema import InvalidSetting, SchemaError, SchemaNotFound, SchemaView, TopicSchemas
from danube_fast.schema.types import definition_bytes, mode_name, parse_policy, type_of


def _internal(what: str, e: Exception) -> ApiError:
    return ApiError("INTERNAL", f"{what}: {e}")


def _schema_response(view: SchemaView, requested_id: int | None = None) -> pb.GetSchemaResponse:
    v = view.version
    return pb.GetSchemaResponse(
        schema_id=view.schema_id if requested_id is None else requested_id, version=v.version,
        subject=view.subject, schema_type=type_of(v.schema_def).value,
        schema_definition=definition_bytes(v.schema_def), description=v.description or "",
        created_at=v.created_at, created_by=v.created_by or "", tags=list(v.tags or ()),
        fingerprint=v.fingerprint, compatibility_mode=mode_name(view.compatibility_mode))


class SchemaRegistryService(pb_grpc.SchemaRegistryServicer):
    def __init__(self, ctx: BrokerContext, schemas: TopicSchemas) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._schemas = schemas
        self._registry = schemas.registry

    def _topic(self, name: str) -> Topic:
        """The topic if this broker serves it (v0.7.3 looks it up among its local topics, so a malformed
        name is simply not found)."""
        topic = self._topics.find(name)
        if topic is None:
            raise not_found(f"Topic {clip(name)} not found on this broker")
        return topic

    @unary
    async def RegisterSchema(self, request: pb.RegisterSchemaRequest, context: Context
                             ) -> pb.RegisterSchemaResponse:
        check_name(request.subject, "RegisterSchemaRequest.subject", slash=False)
        try:
            done = await self._registry.register(
                request.subject, request.schema_type, request.schema_definition,
                description=request.description, created_by=request.created_by, tags=list(request.tags))
        except (SchemaError, BadValue) as e:
            raise _internal("Failed to register schema", e) from e
        return pb.RegisterSchemaResponse(schema_id=done.schema_id, version=done.version,
                                         is_new_version=done.is_new_version, fingerprint=done.fingerprint)

    @unary
    async def GetSchema(self, request: pb.GetSchemaRequest, context: Context) -> pb.GetSchemaResponse:
        version = request.version if request.HasField("version") else None
        try:
            view = await self._registry.by_id(request.schema_id, version)
        except SchemaNotFound as e:
            raise not_found(str(e)) from e
        except SchemaError as e:
            raise not_found(f"Schema not found for ID: {request.schema_id}") from e
        return _schema_response(view, request.schema_id)

    @unary
    async def GetLatestSchema(self, request: pb.GetLatestSchemaRequest, context: Context
                              ) -> pb.GetSchemaResponse:
        try:
            view = await self._registry.latest(request.subject)
        except SchemaError as e:
            raise not_found(f"Schema not found for subject: {clip(request.subject)}") from e
        return _schema_response(view)

    @unary
    async def ListVersions(self, request: pb.ListVersionsRequest, context: Context
                           ) -> pb.ListVersionsResponse:
        try:
            meta = await self._registry.metadata(request.subject)
        except SchemaError as e:
            raise not_found(f"Schema not found for subject: {clip(request.subject)}") from e
        return pb.ListVersionsResponse(versions=[
            pb.SchemaVersionInfo(version=v.version, created_at=v.created_at, created_by=v.created_by or "",
                                 description=v.description or "", fingerprint=v.fingerprint,
                                 schema_id=meta.id)
            for v in sorted(meta.versions, key=lambda v: v.version)])

    @unary
    async def CheckCompatibility(self, request: pb.CheckCompatibilityRequest, context: Context
                                 ) -> pb.CheckCompatibilityResponse:
        mode = request.compatibility_mode if request.HasField("compatibility_mode") else None
        try:
            errors = await self._registry.check(request.subject, request.schema_type,
                                                request.new_schema_definition, mode)
        except InvalidSetting:
            raise
        except (SchemaError, BadValue) as e:
            raise _internal("Failed to check compatibility", e) from e
        return pb.CheckCompatibilityResponse(is_compatible=not errors, errors=errors)

    @unary
    async def DeleteSchemaVersion(self, request: pb.DeleteSchemaVersionRequest, context: Context
                                  ) -> pb.DeleteSchemaVersionResponse:
        try:
            await self._registry.delete_version(request.subject, request.version)
        except (SchemaError, BadValue) as e:
            raise _internal("Failed to delete schema version", e) from e
        return pb.DeleteSchemaVersionResponse(
            success=True, message=f"Deleted version {request.version} for subject {request.subject}")

    @unary
    async def SetCompatibilityMode(self, request: pb.SetCompatibilityModeRequest, context: Context
                                   ) -> pb.SetCompatibilityModeResponse:
        try:
            mode = await self._registry.set_mode(request.subject, request.compatibility_mode)
        except InvalidSetting:
            raise
        except (SchemaError, BadValue) as e:
            raise _internal("Failed to set compatibility mode", e) from e
        return pb.SetCompatibilityModeResponse(
            success=True,
            message=f"Set compatibility mode to {mode_name(mode)} for subject {request.subject}")

    @unary
    async def ConfigureTopicSchema(self, request: pb.ConfigureTopicSchemaRequest, context: Context
                                   ) -> pb.ConfigureTopicSchemaResponse:
        parse_policy(request.validation_policy)  # a bad policy is INVALID_ARGUMENT whatever the topic
        topic = self._topic(request.topic_name)
        await self._schemas.configure(topic, request.schema_subject, request.validation_policy,
                                      request.enable_payload_validation)
        config = self._schemas.config(topic)
        return pb.ConfigureTopicSchemaResponse(
            success=True, message=f"Topic {topic.full} uses schema subject '{config.schema_subject}' with "
                                  f"validation policy {config.validation_policy.value}")

    @unary
    async def UpdateTopicValidationPolicy(self, request: pb.UpdateTopicValidationPolicyRequest,
                                          context: Context) -> pb.UpdateTopicValidationPolicyResponse:
        parse_policy(request.validation_policy)
        topic = self._topic(request.topic_name)
        await self._schemas.update_policy(topic, request.validation_policy, request.enable_payload_validation)
        config = self._schemas.config(topic)
        validation = "on" if config.enable_payload_validation else "off"
        policy = config.validation_policy.value
        return pb.UpdateTopicValidationPolicyResponse(
            success=True, message=f"Topic {topic.full} has validation policy {policy} (payload validation "
                                  f"{validation})")

    @unary
    async def GetTopicSchemaConfig(self, request: pb.GetTopicSchemaConfigRequest, context: Context
                                   ) -> pb.GetTopicSchemaConfigResponse:
        topic = self._topic(request.topic_name)
        config = self._schemas.config(topic)
        schema_id = 0
        if config.schema_subject is not None:
            schema_id = await self._registry.subject_id(config.schema_subject) or 0
        return pb.GetTopicSchemaConfigResponse(
            schema_subject=config.schema_subject or "", validation_policy=config.validation_policy.value,
            enable_payload_validation=config.enable_payload_validation, schema_id=schema_id)
