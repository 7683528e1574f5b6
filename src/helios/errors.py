"""The one exception hierarchy of the project.

Every error a user can cause or meet is a subclass of `HeliosError`. The class, never the message
text, decides the command-line exit code and the HTTP status. Modules define their specific errors
as subclasses of the families below.
"""

from __future__ import annotations


class HeliosError(Exception):
    """Base of every typed error. `exit_code` is the CLI exit status, `http_status` the HTTP one."""

    exit_code = 1
    http_status = 500


class UsageError(HeliosError):
    """A command line or option that cannot be acted on."""

    exit_code = 2
    http_status = 400


class ContractError(HeliosError):
    """A serving contract or execution manifest that is malformed or violates a rule.

    `path` names the offending field, for example ``graphs[3].bindings[2].source``.
    """

    exit_code = 3

    def __init__(self, path: str, message: str):
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)

    def __reduce__(self):
        """Pickles by its two fields (the default would call the constructor with the joined text),
        so it crosses from an engine process with its class and exit code."""
        return type(self), (self.path, self.reason)


class CoreError(HeliosError):
    """A core file that cannot be read, verified or trusted. Subclasses say which check failed."""

    exit_code = 4


class IntegrityError(CoreError):
    """Stored bytes do not match what the signed payload commits to (digests, lengths, frames)."""

    exit_code = 5


class SignatureError(CoreError):
    """No valid signature from a trusted key covers the payload."""

    exit_code = 6


class AuthorizationError(CoreError):
    """The acceptance string does not equal the signed publisher namespace."""

    exit_code = 7


class LoadError(HeliosError):
    """A verified core that this runtime cannot serve (missing variant, unregistered op, ...)."""

    exit_code = 8


class RequestError(HeliosError):
    """A client request that is invalid. HTTP 400. `param` names the request field at fault (the
    error body's ``param``): given to the constructor, or a subclass's own default."""

    exit_code = 2
    http_status = 400
    param: str | None = None

    def __init__(self, message: str = "", param: str | None = None):
        super().__init__(message)
        if param is not None:
            self.param = param


class OverloadedError(HeliosError):
    """HTTP ingress is full. HTTP 429."""

    http_status = 429


class AdmissionRejected(HeliosError):
    """The scheduler cannot admit the request within prepared capacities. HTTP 503."""

    http_status = 503


class WorkerNotServing(HeliosError):
    """The model worker is alive but serves nothing now (unresponsive or stalled, as `/health`
    says): a new request would wait with no bound. HTTP 503; retry later or on another instance."""

    http_status = 503


class ExecutionError(HeliosError):
    """Model execution, device or output failure. HTTP 500."""

    exit_code = 9
    http_status = 500


class ShuttingDown(HeliosError):
    """The server is shutting down: a response still running at the drain deadline ends with this
    (HTTP 503; in a stream, one error event). Retry on another instance."""

    http_status = 503
