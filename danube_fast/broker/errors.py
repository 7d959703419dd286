"""Errors the broker answers clients with: each names the gRPC status the wire contract prescribes.

The status codes drive the official client's control flow (docs/WIRE.md B.13, D.7): UNAVAILABLE,
RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED make it retry (SendMessage forever), so they are used only for
conditions that pass; a permanent refusal is INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED or
NOT_FOUND.
"""

from __future__ import annotations

from danube_fast.errors import DanubeError

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


def unauthenticated(message: str) -> ApiError:
    return ApiError("UNAUTHENTICATED", message)


def denied(message: str) -> ApiError:
    return ApiError("PERMISSION_DENIED", message)


def unavailable(message: str) -> ApiError:
    return ApiError("UNAVAILABLE", message)


def exhausted(message: str) -> ApiError:
    return ApiError("RESOURCE_EXHAUSTED", message)
