"""Why a topic's table waits or stops (its status shows the message): a module of its own so that the broker
names them without importing pyarrow or pyiceberg at start."""


class ModeMismatch(Exception):
    """The topic's table was created in another table mode than its policy now asks for."""


class SchemaModeError(ValueError):
    """The topic's schema cannot type a table: no subject, a kind other than Avro or JSON Schema, or a type
    the mapping or Iceberg cannot express. The table waits (its status says why) until that changes."""


class PartitionSpecError(SchemaModeError):
    """The policy's tablePartitionBy names a column the table lacks, or a transform its column's type does
    not take. The table waits, as for its schema, until the policy (or the subject) changes."""
