"""The schema registry and the validation of what producers publish (docs/WIRE.md C.13).

* `registry`: subjects, versions, compatibility modes, stored in the metadata store.
* `topic_schema`: a topic's subject and validation policy, and the gate that checks published messages.
* `types`: type names, modes, policies, definitions and fingerprints; `compat`: compatibility by mode;
  `avro` and `jsonschema`: the two structured formats; `validators`: payload validation.
* `arrow_values`: a subject's values decoded into a typed Arrow array (not imported here: it needs pyarrow).

GetSchema and GetLatestSchema answer the definition **as registered** (its raw bytes), not v0.7.3's
serialisation of its internal enum (`{"Avro":{"raw_schema":...,"fingerprint":...}}`, `"String"`, ...:
docs/WIRE.md C.13, D.15). The official client passes `schema_definition` through untouched, so
applications see what they registered and can hand it to their Avro or JSON Schema library directly; with
v0.7.3 they had to unwrap an envelope that is an implementation detail of its Rust types. For `bytes`,
`string` and `number`, whose stored definition is only the type, the answer is the type name
(`b"string"`). Everything else in the responses (ids, versions, fingerprints, the lowercase mode) is
v0.7.3's.
"""

from danube_fast.schema.errors import (
    IncompatibleSchema,
    InvalidSchema,
    InvalidSetting,
    RegistryContention,
    SchemaError,
    SchemaNotFound,
    SchemaRejected,
    SubjectConflict,
    SubjectNotFound,
    TopicGone,
    VersionNotDeletable,
)
from danube_fast.schema.registry import Registered, SchemaRegistry, SchemaView
from danube_fast.schema.topic_schema import SchemaGate, TopicSchemaInfo, TopicSchemas
from danube_fast.schema.types import SchemaType

__all__ = [
    "IncompatibleSchema",
    "InvalidSchema",
    "InvalidSetting",
    "Registered",
    "RegistryContention",
    "SchemaError",
    "SchemaGate",
    "SchemaNotFound",
    "SchemaRegistry",
    "SchemaRejected",
    "SchemaType",
    "SchemaView",
    "SubjectConflict",
    "SubjectNotFound",
    "TopicGone",
    "TopicSchemaInfo",
    "TopicSchemas",
    "VersionNotDeletable",
]
