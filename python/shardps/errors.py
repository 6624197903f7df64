"""Errors from the C layer as Python exceptions carrying the status name and message."""


class ShardPSError(RuntimeError):
    """A call into libshardps failed. `code` is the status value (absl::StatusCode),
    `status` its name ("DEADLINE_EXCEEDED", ...), `message` the library's explanation and
    `call` the C function."""

    def __init__(self, code, status, message, call):
        super().__init__("%s: %s (%s)" % (status, message, call))
        self.code, self.status, self.message, self.call = code, status, message, call
        self.handle = None  # Worker.wait_any: the Handle whose request failed


class InvalidArgumentError(ShardPSError, ValueError):
    pass


class DeadlineExceededError(ShardPSError, TimeoutError):
    pass


class NotFoundError(ShardPSError, LookupError):
    pass


class UnavailableError(ShardPSError, ConnectionError):
    pass


class FailedPreconditionError(ShardPSError):
    """The call does not fit the cluster's state or configuration (the message says which)."""


class UnimplementedError(ShardPSError, NotImplementedError):
    """E.g. push_pull_cuda on a library built without CUDA."""


_BY_NAME = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "NOT_FOUND": NotFoundError,
    "UNAVAILABLE": UnavailableError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "UNIMPLEMENTED": UnimplementedError,
}


def check(lib, code, message, call):
    """Raises the exception for status `code` unless it is OK (0)."""
    if code == 0:
        return
    status = lib.shardps_status_name(code).decode()
    text = message.decode(errors="replace") if isinstance(message, bytes) else str(message)
    raise _BY_NAME.get(status, ShardPSError)(code, status, text, call)
