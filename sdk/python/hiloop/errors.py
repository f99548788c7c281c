"""The API's refusals as exceptions: one class per family, each carrying the
stable code, the message and the request id (for the server's log)."""

from typing import Optional, Type


class HiloopError(Exception):
    """An error the API answered, or one of the client's own."""

    def __init__(self, message: str, code: str = "", status: int = 0, request_id: str = "",
                 field: str = "", retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.request_id = request_id
        self.field = field
        self.retry_after = retry_after

    def __str__(self) -> str:
        s = "%s (%s)" % (self.message, self.code) if self.code else self.message
        if self.request_id:
            s += " [request %s]" % self.request_id
        return s


class InvalidRequestError(HiloopError):
    """400, 411, 413, 415: the request itself is wrong (field says which part)."""


class AuthenticationError(HiloopError):
    """401: missing, unknown or revoked key."""


class NotFoundError(HiloopError):
    """404: no such sandbox in your organization, no such file, no such route."""


class ConflictError(HiloopError):
    """409: the sandbox's state forbids it (not running, quarantined, ...)."""


class QuotaError(HiloopError):
    """429: a quota, a session limit or a rate limit."""


class UnsupportedError(HiloopError):
    """422: a capability the deployment or the sandbox's image lacks
    (unsupported_capability, tar_unavailable, shell_unavailable, ...)."""


class UnavailableError(HiloopError):
    """502, 503, 504: hiloop or the cluster cannot do it now; try again."""


class StreamLostError(HiloopError):
    """The exec stream broke before the exit status arrived: the command's
    fate is unknown. Never a non-zero exit code."""


class ExtractError(HiloopError):
    """A directory's tar stream that download_dir refused to write, since
    what the sandbox sends is not trusted. code says why: invalid_path (an
    entry names a place outside the destination), path_conflict (a
    directory on an entry's way is a symbolic link or a file, or the
    entry's place holds what it cannot replace: a directory, or, without
    overwrite, anything), sparse_entry (a sparse file), invalid_tar (not a
    well-formed tar stream, or one that ended early)."""


class LimitError(HiloopError):
    """The server sent more than the client accepts: code extract_limit
    (download_dir past its max_bytes or max_entries), output_limit (exec's
    collected output past max_output, read past its max_bytes, a JSON
    answer past what the client reads)."""


class WaitError(HiloopError):
    """Waiting for a state ended in another state that will not lead to it."""


def error_for(status: int, code: str, message: str, request_id: str = "", field: str = "",
              retry_after: Optional[float] = None) -> HiloopError:
    """The exception of an error answer."""
    cls: Type[HiloopError]
    if status == 401:
        cls = AuthenticationError
    elif status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = ConflictError
    elif status == 429:
        cls = QuotaError
    elif status == 422:
        cls = UnsupportedError
    elif status in (502, 503, 504):
        cls = UnavailableError
    elif 400 <= status < 500:
        cls = InvalidRequestError
    else:
        cls = HiloopError
    return cls(message, code=code, status=status, request_id=request_id, field=field, retry_after=retry_after)
