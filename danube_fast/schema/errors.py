"""The schema registry's errors, in the product's one error tree.

Each carries the status it most naturally maps to; the SchemaRegistry servicer re-maps some of them where
docs/WIRE.md C.13 prescribes another code for a given RPC (RegisterSchema answers INTERNAL for every
failure, CheckCompatibility INTERNAL for an unknown subject, CreateProducer FAILED_PRECONDITION for an
unregistered subject).
"""

from __future__ import annotations

from collections.abc import Sequence

from danube_fast.errors import DanubeError


class SchemaError(DanubeError):
    """A schema registry operation failed."""


class InvalidSchema(SchemaError, ValueError):
    """A definition that does not parse as its type, or an unknown schema type."""

    grpc_code = "INVALID_ARGUMENT"


class InvalidSetting(SchemaError, ValueError):
    """An unknown compatibility mode or validation policy."""

    grpc_code = "INVALID_ARGUMENT"


class IncompatibleSchema(SchemaError):
    """A new version breaks the subject's compatibility mode; `errors` lists why."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, subject: str, mode: str, errors: Sequence[str]) -> None:
        super().__init__(f"schema is not {mode} compatible with the latest version of subject {subject!r}: "
                         + "; ".join(errors))
        self.errors = list(errors)


class SubjectNotFound(SchemaError, LookupError):
    grpc_code = "NOT_FOUND"

    def __init__(self, subject: str) -> None:
        super().__init__(f"Schema not found for subject: {subject}")
        self.subject = subject


class SchemaNotFound(SchemaError, LookupError):
    """An unknown schema id, or a version the subject does not have."""

    grpc_code = "NOT_FOUND"


class VersionNotDeletable(SchemaError):
    """Deleting the only version of a subject (a subject always keeps one: its id stays resolvable)."""

    grpc_code = "FAILED_PRECONDITION"


class SubjectConflict(SchemaError):
    """A topic that uses one subject was asked to use another."""

    grpc_code = "FAILED_PRECONDITION"


class TopicGone(SchemaError, LookupError):
    """The topic was deleted while its schema configuration was being written."""

    grpc_code = "NOT_FOUND"


class RegistryContention(SchemaError):
    """A read-modify-write lost its compare-and-swap race too many times in a row."""

    grpc_code = "UNAVAILABLE"
    retriable = True


class SchemaRejected(SchemaError):
    """A message refused by its topic's validation policy (SendMessage answers PERMISSION_DENIED)."""

    grpc_code = "PERMISSION_DENIED"
