"""The project's exceptions: one root, one class per way things go wrong.

Each class's docstring is its default message. Servicers turn these into gRPC statuses in one
place (`lowtide.grpc_status`), so nothing below the servicers knows about gRPC and nothing above
the database adapter knows about psycopg.
"""

from __future__ import annotations


class LowtideError(Exception):
    """Something went wrong in lowtide."""

    # Binary trailing metadata (key ending in -bin, value) that details the error for clients.
    trailing: tuple[tuple[str, bytes], ...] = ()

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidArgument(LowtideError):
    """A request field has a value lowtide cannot accept."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}")


class TooLarge(LowtideError):
    """A request is larger than the configured limit."""


class TooFast(LowtideError):
    """A caller sends faster than it may (RESOURCE_EXHAUSTED, as a limit of size is)."""


class NotFound(LowtideError):
    """No such object."""


class AlreadyExists(LowtideError):
    """The object already exists."""


class FailedPrecondition(LowtideError):
    """The request cannot be carried out in the current state."""


class ReservationConflict(FailedPrecondition):
    """Admission refused a fixed start: the pool's reservable capacity is taken in its window.

    `trailing` carries a serialized lowtide.v1.ReservationConflict under RESERVATION_CONFLICT_KEY.
    """

    def __init__(self, message: str, details: bytes) -> None:
        super().__init__(message)
        self.trailing = ((RESERVATION_CONFLICT_KEY, details),)


RESERVATION_CONFLICT_KEY = "lowtide-reservation-conflict-bin"


class PermissionDenied(LowtideError):
    """The caller's token may not do this."""


class Aborted(LowtideError):
    """The call was ended because something newer took its place."""


class Unavailable(LowtideError):
    """The service cannot carry the call on now; the caller should connect again (with backoff)."""


class DatabaseUnavailable(LowtideError):
    """The database cannot be reached; nothing was stored. Retry later."""


class ConfigError(LowtideError):
    """The configuration is not valid."""


# The exit status of a command stopped by a ConfigError (sysexits' EX_CONFIG), a listen address
# that cannot be bound included: `lowtide up` tells it from a crash, which it restarts.
EXIT_CONFIG = 78
