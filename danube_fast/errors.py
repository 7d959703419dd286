"""One error tree for the whole product.

Every error carries `retriable` (may the caller try the same thing again later?) and `grpc_code` (the
status the broker answers with). The code is a name of `grpc.StatusCode` so that the storage layer does not
import grpc. Causes are chained with `raise ... from e`, never flattened into strings.
"""

from __future__ import annotations


class DanubeError(Exception):
    retriable: bool = False
    grpc_code: str = "INTERNAL"


class FrameCorrupt(DanubeError, ValueError):
    """A record batch failed validation. `position` is the byte position of the offending batch."""

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, position: int = 0) -> None:
        super().__init__(f"{message} (batch at byte {position})")
        self.position = position


class StorageError(DanubeError):
    """The write-ahead log or another store could not do what was asked."""


class WalCorrupt(StorageError):
    """A sealed segment or its index is damaged in a way recovery must not silently cut."""


class WalWriteError(StorageError):
    """A write, an fsync or a reservation of disk space for the index failed (disk full, read-only or
    unwritable directory, I/O error).

    After a failed fsync the log refuses further appends: what the kernel kept is unknown until the log is
    reopened and recovered.
    """

    grpc_code = "UNAVAILABLE"
    retriable = True


class WalBusy(StorageError):
    """The WAL's directory is open already, in this process or another (storage/dir_lock.py)."""

    grpc_code = "UNAVAILABLE"
    retriable = True


class WalClosed(StorageError):
    """The log was closed (or failed) while the operation waited."""

    grpc_code = "UNAVAILABLE"
    retriable = True


class OffsetOutOfRange(StorageError):
    """A read asked for an offset that retention already deleted (or that is not written yet)."""

    grpc_code = "OUT_OF_RANGE"


class ObjectStoreError(StorageError):
    """The object tier (S3 or a local folder) refused an operation for a reason retrying will not fix:
    access denied, no such bucket, an invalid key."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The object store cannot be reached or answered with a server error (5xx, throttling, a timeout, a
    connection refused or reset, an I/O error of the folder). Try again later; nothing was lost."""

    grpc_code = "UNAVAILABLE"
    retriable = True


class ObjectNotFound(ObjectStoreError):
    """No object under that key: deleted by retention, or never written."""

    grpc_code = "NOT_FOUND"


class ObjectCorrupt(ObjectStoreError):
    """An object's trailer, footer or batches fail their checks (bad magic, CRC mismatch, inconsistent
    offsets): the bytes in the store are not what the uploader wrote."""

    grpc_code = "DATA_LOSS"


# -- what the broker answers clients with -----------------------------------------------------------------
# The status codes drive the official client's control flow (docs/WIRE.md B.13, D.7): UNAVAILABLE,
# RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED make it retry (SendMessage forever), so they are used only for
# conditions that pass; a permanent refusal is INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED or
# NOT_FOUND.

_RETRIABLE = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})


class ApiError(DanubeError):
    """A refusal with the status the contract names for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.grpc_code = code
        self.retriable = code in _RETRIABLE


def invalid(message: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", message)


def not_found(message: str) -> ApiError:
    return ApiError("NOT_FOUND", message)


def precondition(message: str) -> ApiError:
    return ApiError("FAILED_PRECONDITION", message)


def already_exists(message: str) -> ApiError:
    return ApiError("ALREADY_EXISTS", message)


def unauthenticated(message: str) -> ApiError:
    return ApiError("UNAUTHENTICATED", message)


def denied(message: str) -> ApiError:
    return ApiError("PERMISSION_DENIED", message)


def unavailable(message: str) -> ApiError:
    return ApiError("UNAVAILABLE", message)


def exhausted(message: str) -> ApiError:
    return ApiError("RESOURCE_EXHAUSTED", message)
