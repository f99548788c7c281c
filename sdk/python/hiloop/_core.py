"""What the synchronous client (hiloop.Client) and the asyncio one
(hiloop.aio.Client) share, so the two cannot drift: how each call's
request is built, how an answer or a refusal is read, when a call is
retried, the typed sandbox, the exec stream's protocol and the WebSocket
framing under it. Nothing here does I/O; each client only moves the bytes
this module describes.

A new API call is one builder here (a Call, or a path) and one method per
client that sends it."""

import base64
import datetime
import hashlib
import http.client as http_client
import ipaddress
import json
import os
import re
import struct
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import SplitResult, quote, urlencode, urlsplit

from .errors import HiloopError, LimitError, StreamLostError, WaitError, error_for

EXEC_SUBPROTOCOL = "hiloop.exec.v1"
CHAN_STDIN, CHAN_STDOUT, CHAN_STDERR, CHAN_EXIT, CHAN_RESIZE, CHAN_CLOSE_IN = 0, 1, 2, 3, 4, 255
TAR_MEDIA_TYPE = "application/x-tar"

# States from which waiting for another cannot succeed.
FAILED_STATES = frozenset({"exited", "expired", "deleted", "lost", "attention", "quarantined", "failed"})

Command = Union[str, Sequence[str]]
# A duration: a Go duration string ("90m", "1h30m", "0"), seconds as a
# number, or a datetime.timedelta.
Duration = Union[str, int, float, datetime.timedelta]

# How much longer than its own time a call that may wake a sandbox waits:
# serve's --wake-timeout, by default.
WAKE_WAIT = 120.0
# MAX_FILE_BYTES is download_dir's default cap on the bytes of a directory,
# and read's on a file: serve's default --max-file-size
# (api.DefaultMaxFileBytes).
MAX_FILE_BYTES = 1 << 30
# MAX_ENTRIES is download_dir's default cap on a directory's entries.
MAX_ENTRIES = 100_000
# MAX_OUTPUT is exec's default cap on each of stdout and stderr it collects.
MAX_OUTPUT = 16 << 20
# The largest JSON answer read: run's, with 1 MiB of each stream escaped,
# is well below.
MAX_ANSWER = 32 << 20
# How long exec waits for the upgrade (plus WAKE_WAIT when it may wake),
# and how much longer than the command's timeout for its exit status, the
# server's own delays (reaching the cluster, the exit frame) included; run
# waits the same margin for its answer.
HANDSHAKE_WAIT = 30.0
EXEC_MARGIN = 60.0
RUN_MARGIN = 60.0
# The server's longest command (api.MaxExecTimeout), an exec's without a
# timeout.
MAX_EXEC_TIMEOUT = 24 * 3600.0
# The longest a refusal's Retry-After is waited before a retry.
MAX_RETRY_WAIT = 60.0
# The most bytes of an error answer, or of an HTTP head, read.
MAX_ERROR_BODY = 64 << 10
MAX_HEAD = 64 << 10
# How many idle keep-alive connections a client keeps, and for how long
# one may sit idle before it is dropped rather than reused (below the
# server's own idle timeout of two minutes).
POOL_SIZE = 8
POOL_IDLE = 50.0


# -- the client's URL ----------------------------------------------------

def is_loopback(host: str) -> bool:
    """Reports whether host names this machine's loopback: localhost, or an
    address in 127.0.0.0/8 or ::1 (as the Go client decides)."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def parse_url(url: Optional[str]) -> Tuple[str, SplitResult]:
    """The API's URL (HILOOP_URL, else hiloop dev's), refused with
    ValueError unless it is https://, or http:// to loopback: the key is
    sent in the clear only to this machine."""
    url = (url or os.environ.get("HILOOP_URL") or "http://127.0.0.1:8080").rstrip("/")
    u = urlsplit(url)
    if u.scheme not in ("http", "https"):
        raise ValueError("HILOOP_URL %r: want http:// or https://" % url)
    if u.scheme == "http" and not is_loopback(u.hostname or ""):
        raise ValueError("refusing to send the API key over plain http:// to %s; use https://" % u.netloc)
    return url, u


def auth_headers(token: str) -> Dict[str, str]:
    return {"Authorization": "Bearer " + token} if token else {}


# -- values --------------------------------------------------------------

def duration(v: Duration, name: str) -> str:
    """A duration as the API takes it: a string as given, seconds (a
    number or a timedelta) as whole milliseconds."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        raise TypeError("%s: want a duration such as \"1h\", seconds or a timedelta, not a bool" % name)
    if isinstance(v, datetime.timedelta):
        v = v.total_seconds()
    if not isinstance(v, (int, float)):
        raise TypeError("%s: want a duration such as \"1h\", seconds or a timedelta, not %s" % (
            name, type(v).__name__))
    ms = int(round(v * 1000))
    return "%ds" % (ms // 1000) if ms % 1000 == 0 else "%dms" % ms


def argv(cmd: Command) -> List[str]:
    """A string runs through sh -c; a list is the argv as is."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    return list(cmd)


_FRACTION = re.compile(r"\.(\d+)")


def parse_time(v: Any) -> Optional[datetime.datetime]:
    """An RFC 3339 timestamp as the server writes it (nanoseconds, Z) as
    an aware datetime; None when absent or unreadable."""
    if not isinstance(v, str) or not v:
        return None
    s = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], v, count=1)
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        return datetime.datetime.fromisoformat(s)
    except ValueError:
        return None


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the API answered it (api.Sandbox; docs/api.md). Times
    are aware datetimes. It also reads as the answer's JSON object
    (info["desired"], info.get("reason")), with any field this version of
    the client does not know."""

    id: str
    state: str = ""
    desired: str = ""
    image: str = ""
    reason: str = ""
    anomaly: str = ""
    exit_code: Optional[int] = None
    ttl: str = ""
    expires_at: Optional[datetime.datetime] = None
    idle_timeout: str = ""
    last_activity_at: Optional[datetime.datetime] = None
    stopped_by: str = ""
    shutdown_policy: str = ""
    resources: Dict[str, str] = field(default_factory=dict)
    volumes: List[Dict[str, str]] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    transports: List[str] = field(default_factory=list)
    isolation: str = ""
    runtime_observed: str = ""
    kernel_release: str = ""
    created_at: Optional[datetime.datetime] = None
    updated_at: Optional[datetime.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "SandboxInfo":
        """The sandbox of an answer; one without a string id raises
        HiloopError (code bad_answer)."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise HiloopError("the answer is not a sandbox", code="bad_answer")
        kw: Dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "raw" or f.name not in data or data[f.name] is None:
                continue
            v = data[f.name]
            if f.name.endswith("_at"):
                v = parse_time(v)
            elif f.name == "exit_code":
                v = v if isinstance(v, int) and not isinstance(v, bool) else None
            elif f.default_factory is dict:  # type: ignore[comparison-overlap]
                v = dict(v) if isinstance(v, dict) else {}
            elif f.default_factory is list:  # type: ignore[comparison-overlap]
                v = list(v) if isinstance(v, list) else []
            elif not isinstance(v, str):
                v = str(v)
            kw[f.name] = v
        return cls(raw=dict(data), **kw)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def keys(self) -> Any:
        return self.raw.keys()


class CommandResult:
    """How a command ended: its exit code (128+n for a death by signal n,
    with signal naming it), or timed_out with exit_code None."""

    def __init__(self, exit_code: Optional[int], stdout: bytes, stderr: bytes, timed_out: bool = False,
                 signal: str = "", encoding: str = "") -> None:
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.signal = signal
        # How run's answer carried the output ("utf-8" or "base64"); the
        # bytes are the command's either way. "" for exec.
        self.encoding = encoding

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def __repr__(self) -> str:
        return "CommandResult(exit_code=%r, timed_out=%r, signal=%r, stdout=%r, stderr=%r)" % (
            self.exit_code, self.timed_out, self.signal, self.stdout[:80], self.stderr[:80])


class SandboxBase:
    """What a sandbox handle of either client holds: its id and the last
    answer about it."""

    def __init__(self, data: Union[SandboxInfo, Mapping[str, Any]]) -> None:
        self.info = data if isinstance(data, SandboxInfo) else SandboxInfo.from_json(dict(data))
        self.id: str = self.info.id

    @property
    def data(self) -> SandboxInfo:
        """The last answer (SandboxInfo, which also reads as its JSON)."""
        return self.info

    @property
    def state(self) -> str:
        return self.info.state

    def _set(self, data: Any) -> None:
        self.info = SandboxInfo.from_json(data)

    def _path(self, rest: str = "") -> str:
        return sandbox_path(self.id, rest)

    def __repr__(self) -> str:
        return "Sandbox(%s, %s)" % (self.id, self.state)


# -- requests ------------------------------------------------------------

@dataclass
class Call:
    """One HTTP request of the API: what to send and how long to wait for
    its whole answer (None: the client's timeout)."""

    method: str
    path: str
    body: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    timeout: Optional[float] = None

    @property
    def what(self) -> str:
        return "%s %s" % (self.method, self.path.split("?")[0])

    @property
    def replayable(self) -> bool:
        """Reports whether sending the request twice does what sending it
        once does, so a connection found dead under it may be retried on
        another: a read, or a create with its Idempotency-Key."""
        return self.method in ("GET", "HEAD", "PUT", "DELETE") or "Idempotency-Key" in self.headers


def sandbox_path(sandbox_id: str, rest: str = "") -> str:
    return "/v1/sandboxes/" + quote(sandbox_id, safe="") + rest


def json_call(method: str, path: str, payload: Any = None, headers: Optional[Mapping[str, str]] = None,
              timeout: Optional[float] = None) -> Call:
    hdrs = dict(headers or {})
    body = None
    if payload is not None:
        body = json.dumps(payload).encode()
        hdrs["Content-Type"] = "application/json"
    return Call(method, path, body, hdrs, timeout)


def create_call(image: str, idempotency_key: str, ttl: Optional[Duration] = None,
                volumes: Optional[Sequence[Mapping[str, str]]] = None, labels: Optional[Mapping[str, str]] = None,
                transports: Optional[Sequence[str]] = None, resources: Optional[Mapping[str, str]] = None,
                shutdown_policy: Optional[str] = None, idle_timeout: Optional[Duration] = None,
                env: Optional[Mapping[str, str]] = None) -> Call:
    req: Dict[str, Any] = {"image": image}
    if ttl is not None:
        req["ttl"] = duration(ttl, "ttl")
    if idle_timeout is not None:
        req["idle_timeout"] = duration(idle_timeout, "idle_timeout")
    for k, v in (("volumes", volumes), ("transports", transports)):
        if v is not None:
            req[k] = [dict(x) if isinstance(x, Mapping) else x for x in v]
    for k, m in (("labels", labels), ("resources", resources), ("env", env)):
        if m is not None:
            req[k] = dict(m)
    if shutdown_policy is not None:
        req["shutdown_policy"] = shutdown_policy
    return json_call("POST", "/v1/sandboxes", req, {"Idempotency-Key": idempotency_key})


def list_call(state: Optional[str], labels: Optional[Mapping[str, str]], limit: Optional[int], after: str) -> Call:
    q: List[Tuple[str, str]] = []
    if state:
        q.append(("state", state))
    for k, v in (labels or {}).items():
        q.append(("label", "%s=%s" % (k, v)))
    if limit:
        q.append(("limit", str(limit)))
    if after:
        q.append(("after", after))
    return json_call("GET", "/v1/sandboxes" + ("?" + urlencode(q) if q else ""))


def list_page(data: Any) -> Tuple[List[SandboxInfo], str]:
    """A page's sandboxes and the cursor of the next page ("" at the end)."""
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise HiloopError("the answer is not a page of sandboxes", code="bad_answer")
    nxt = data.get("next") or ""
    return [SandboxInfo.from_json(x) for x in data["items"]], nxt if isinstance(nxt, str) else ""


def update_call(sandbox_id: str, ttl: Optional[Duration] = None, idle_timeout: Optional[Duration] = None) -> Call:
    """PATCH: the new TTL (from now) and idle timeout ("0" turns idle stop
    off). The server refuses one that sets neither (invalid_field)."""
    req: Dict[str, str] = {}
    if ttl is not None:
        req["ttl"] = duration(ttl, "ttl")
    if idle_timeout is not None:
        req["idle_timeout"] = duration(idle_timeout, "idle_timeout")
    return json_call("PATCH", sandbox_path(sandbox_id), req)


def wait_call(sandbox_id: str, state: str, seconds: int) -> Call:
    """The long poll that answers once the sandbox leaves state."""
    return json_call("GET", sandbox_path(sandbox_id, "?" + urlencode({"while": state, "wait": "%ds" % seconds})),
                     timeout=seconds + 30)


def wait_step(info: SandboxInfo, want: str, left: float) -> Optional[int]:
    """What waiting for want does next after the answer info, with left
    seconds to go: None when it is there, else the long poll's seconds.
    WaitError for a state that will not lead there, TimeoutError past
    the deadline."""
    if info.state == want:
        return None
    if info.state in FAILED_STATES or (want == "running" and info.desired != "running"):
        raise WaitError("sandbox %s is %s (%s), waiting for %s" % (info.id, info.state, info.reason, want),
                        code="wait_failed")
    if left <= 0:
        raise TimeoutError("timed out waiting for %s; sandbox %s is %s" % (want, info.id, info.state))
    return max(1, min(30, int(left)))


def events_items(data: Any) -> List[Dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise HiloopError("the answer is not a list of events", code="bad_answer")
    items: List[Dict[str, Any]] = data["items"]
    return items


def command_request(cmd: Command, env: Optional[Mapping[str, str]], cwd: Optional[str]) -> Dict[str, Any]:
    """The command of an exec or run, with the variables added to its
    environment and the directory it runs in, when given."""
    req: Dict[str, Any] = {"command": argv(cmd)}
    if env is not None:
        req["env"] = dict(env)
    if cwd is not None:
        req["cwd"] = cwd
    return req


def run_call(sandbox_id: str, cmd: Command, timeout: Optional[float], stdin: Optional[Union[str, bytes]],
             wake: bool, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> Call:
    """POST .../exec/run, waiting for the answer the command's timeout
    and a margin (and a wake's time when it may wake the sandbox)."""
    req = command_request(cmd, env, cwd)
    if timeout is not None:
        req["timeout"] = "%dms" % int(timeout * 1000)
    if stdin is not None:
        req["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
    path, wait = sandbox_path(sandbox_id, "/exec/run"), (timeout or 60) + RUN_MARGIN
    if wake:
        path, wait = path + "?wake=true", wait + WAKE_WAIT
    return json_call("POST", path, req, timeout=wait)


def run_result(res: Any) -> CommandResult:
    if not isinstance(res, dict) or not isinstance(res.get("stdout"), str) or not isinstance(res.get("stderr"), str):
        raise HiloopError("the answer is not a command's result", code="bad_answer")
    code = res.get("exit_code")
    enc = res.get("encoding") or "utf-8"
    out, err = run_output(res["stdout"], enc), run_output(res["stderr"], enc)
    return CommandResult(code if isinstance(code, int) and not isinstance(code, bool) else None,
                         out, err, bool(res.get("timed_out")), str(res.get("signal", "")), enc)


def run_output(text: str, encoding: Any) -> bytes:
    """A stream of run's answer as the command wrote it: the text itself
    (utf-8, or no encoding from a server before the field), or base64's
    bytes; any other encoding, or base64 that is not, is bad_answer."""
    if encoding == "utf-8":
        return text.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(text.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError):
            pass
    raise HiloopError("the command's output is in no encoding the client reads (%.40r)" % encoding,
                      code="bad_answer")


def files_path(sandbox_id: str, path: str, wake: bool, **extra: str) -> str:
    if wake:
        extra["wake"] = "true"
    return sandbox_path(sandbox_id, "/files?" + urlencode(dict(path=path, **extra)))


def decode_json(data: bytes, status: int) -> Any:
    if status == 204 or not data:
        return None
    return json.loads(data)


def too_large(what: str, cap: int) -> LimitError:
    return LimitError("%s is larger than %d bytes" % (what, cap), code="output_limit")


# -- refusals ------------------------------------------------------------

def error_from(status: int, headers: Mapping[str, str], body: bytes) -> HiloopError:
    """The exception of an error answer: its JSON error body's code,
    message, field and request id, and the wait Retry-After asks of a 429
    or 503. headers' names are lower case."""
    code, message, fld, request_id = "http_%d" % status, body.decode("utf-8", "replace").strip(), "", ""
    try:
        e = json.loads(body)["error"]
        code, message = str(e["code"]), str(e.get("message", ""))
        fld, request_id = str(e.get("field", "")), str(e.get("request_id", ""))
    except (ValueError, KeyError, TypeError):
        pass
    request_id = request_id or headers.get("x-request-id", "") or ""
    retry_after = None
    ra = headers.get("retry-after")
    if status in (429, 503) and ra is not None:
        try:
            retry_after = max(float(ra), 0.1)
        except ValueError:
            retry_after = 1.0
    return error_for(status, code, message, request_id, fld, retry_after)


def retry_wait(err: HiloopError, attempt: int, max_retries: int) -> Optional[float]:
    """How long to wait before trying a refused call again, or None to
    raise err: only a refusal that asks for a retry (Retry-After) is."""
    if attempt >= max_retries or err.retry_after is None:
        return None
    return min(err.retry_after, MAX_RETRY_WAIT)


def stream_status(code: str) -> int:
    """The HTTP status the code has outside a stream, for its family."""
    return {"session_ended": 409, "exec_failed": 502, "cluster_unavailable": 503,
            "invalid_frame": 400, "invalid_field": 400, "invalid_env": 422, "shell_unavailable": 422,
            "file_not_found": 404, "path_conflict": 409}.get(code, 500)


def timeout_error(call: Call, wait: float) -> TimeoutError:
    return TimeoutError("%s: no whole answer within %gs" % (call.what, wait))


# -- the exec stream -----------------------------------------------------

def exec_url(base: str, sandbox_id: str, stdin: bool, tty: bool, timeout: Optional[float],
             wake: bool) -> Tuple[str, float]:
    """The stream's URL (the argv goes in the first message, so it stays
    out of proxy and access logs) and how long its upgrade may take."""
    if tty and not stdin:
        raise ValueError("a tty needs stdin")
    q: Dict[str, str] = {}
    if stdin:
        q["stdin"] = "true"
    if tty:
        q["tty"] = "true"
    if timeout is not None:
        q["timeout"] = "%dms" % int(timeout * 1000)
    handshake = HANDSHAKE_WAIT
    if wake:
        q["wake"] = "true"
        handshake += WAKE_WAIT
    return base + sandbox_path(sandbox_id, "/exec") + ("?" + urlencode(q) if q else ""), handshake


def exec_deadline_after(timeout: Optional[float]) -> float:
    """Seconds from the upgrade by which the exit status must arrive."""
    return (timeout if timeout is not None else MAX_EXEC_TIMEOUT) + EXEC_MARGIN


def start_message(cmd: Command, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> bytes:
    """The exec stream's first message: the command, its env and cwd, all
    out of the URL (the environment may hold credentials)."""
    return json.dumps(command_request(cmd, env, cwd)).encode()


def stdin_message(chunk: bytes) -> bytes:
    return bytes([CHAN_STDIN]) + chunk


def close_stdin_message() -> bytes:
    return bytes([CHAN_CLOSE_IN, CHAN_STDIN])


def resize_message(width: int, height: int) -> bytes:
    if not (0 < int(width) < 1 << 16 and 0 < int(height) < 1 << 16):
        raise ValueError("a terminal's width and height are from 1 to 65535")
    return bytes([CHAN_RESIZE]) + json.dumps({"width": int(width), "height": int(height)}).encode()


def lost(e: BaseException, late: bool) -> StreamLostError:
    """The error of a stream that ended without its exit status; late: at
    the exit status's deadline."""
    if late:
        e = TimeoutError("no exit status within the command's timeout and %gs" % EXEC_MARGIN)
    return StreamLostError("the exec stream ended without an exit status: %s" % e, code="stream_lost")


def before_start(e: BaseException) -> StreamLostError:
    return StreamLostError("the exec stream ended before it began: %s" % e, code="stream_lost")


STDOUT, STDERR = "stdout", "stderr"


def output(msg: bytes) -> Tuple[Optional[str], bytes]:
    """A server message's stream ("stdout", "stderr", "exit", or None for
    one to skip) and payload."""
    if not msg:
        return None, b""
    ch = msg[0]
    name = {CHAN_STDOUT: STDOUT, CHAN_STDERR: STDERR, CHAN_EXIT: "exit"}.get(ch)
    return name, msg[1:]


class Collector:
    """Collects a command's output up to max_output bytes of each stream,
    or hands each chunk to its callback (then uncapped)."""

    def __init__(self, max_output: int, on_stdout: Optional[Callable[[bytes], None]] = None,
                 on_stderr: Optional[Callable[[bytes], None]] = None) -> None:
        self.max_output = max_output
        self.out, self.err = bytearray(), bytearray()
        self.on = {STDOUT: on_stdout, STDERR: on_stderr}

    def add(self, name: str, payload: bytes) -> None:
        cb = self.on[name]
        if cb is not None:
            cb(payload)
            return
        buf = self.out if name == STDOUT else self.err
        if len(buf) + len(payload) > self.max_output:
            raise LimitError("the command's %s passed max_output (%d bytes); pass on_%s to take more" % (
                name, self.max_output, name), code="output_limit")
        buf.extend(payload)

    def result(self, exit_payload: bytes) -> CommandResult:
        return exit_result(exit_payload, bytes(self.out), bytes(self.err))


def exit_result(payload: bytes, out: bytes, errs: bytes) -> CommandResult:
    """The result an exit frame tells, or the error it carries."""
    try:
        f = json.loads(payload)
    except ValueError:
        f = None
    if not isinstance(f, dict):
        raise StreamLostError("the exit frame is not a JSON object", code="stream_lost")
    e = f.get("error")
    if e:
        if not isinstance(e, dict):
            raise StreamLostError("the exit frame's error is not an object", code="stream_lost")
        code = str(e.get("code", ""))
        if code == "exec_timeout":
            return CommandResult(None, out, errs, timed_out=True)
        raise error_for(stream_status(code), code, str(e.get("message", "")), str(e.get("request_id", "")),
                        str(e.get("field", "")))
    exit_code = f.get("exit_code")
    if not isinstance(exit_code, int) or isinstance(exit_code, bool):
        raise StreamLostError("the exit frame carried no exit code", code="stream_lost")
    return CommandResult(exit_code, out, errs, signal=str(f.get("signal", "")))


# -- WebSocket framing (RFC 6455, the client's side) ----------------------

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
# The largest message the client accepts (the server sends at most 1 MiB).
MAX_MESSAGE = 4 << 20


class HandshakeError(Exception):
    """The server answered the upgrade with an HTTP status, not 101."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        super().__init__("websocket handshake answered %d" % status)
        self.status = status
        self.headers = headers
        self.body = body


class ConnectionClosed(Exception):
    """The connection ended, or broke the protocol."""


def ws_target(url: str) -> Tuple[SplitResult, bool, str, int]:
    """The URL's parts, whether it is TLS, its host and port."""
    u = urlsplit(url)
    secure = u.scheme in ("https", "wss")
    return u, secure, u.hostname or "localhost", u.port or (443 if secure else 80)


def ws_handshake(u: SplitResult, headers: Mapping[str, str], subprotocol: str) -> Tuple[bytes, str]:
    """The upgrade request and the Sec-WebSocket-Accept its answer must
    carry."""
    key = base64.b64encode(os.urandom(16)).decode()
    path = u.path + ("?" + u.query if u.query else "")
    lines = [
        "GET %s HTTP/1.1" % path,
        "Host: %s" % (u.netloc.split("@")[-1]),
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: " + key,
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Protocol: " + subprotocol,
    ] + ["%s: %s" % kv for kv in headers.items()]
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), accept


def split_head(buf: bytes) -> Optional[Tuple[int, Dict[str, str], bytes]]:
    """An HTTP answer's status, headers (names lower case) and what
    follows its head in buf; None until buf holds the whole head.
    ConnectionClosed for a head too long or not HTTP."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD:
            raise ConnectionClosed("answer head too long")
        return None
    lines = buf[:end].decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    if len(first) < 2 or not first[0].startswith("HTTP/") or not first[1].isdigit():
        raise ConnectionClosed("the answer is not HTTP")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(first[1]), headers, buf[end + 4:]


def handshake_body_length(headers: Mapping[str, str]) -> int:
    """How much of a refused upgrade's body to read: its length, capped."""
    cl = headers.get("content-length", "0")
    return min(int(cl), MAX_ERROR_BODY) if cl.isdigit() else 0


def handshake_error(e: HandshakeError) -> HiloopError:
    return error_from(e.status, e.headers, e.body)


def encode_frame(opcode: int, payload: bytes) -> bytes:
    """One final frame, masked as a client's must be."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 4096 else mask_bytes(payload, mask)
    return head + mask + masked


def close_frame() -> bytes:
    return encode_frame(OP_CLOSE, struct.pack("!H", 1000))


def mask_bytes(data: bytes, mask: bytes) -> bytes:
    """XORs data with the 4-byte mask, fast for large payloads."""
    n = len(data)
    if n == 0:
        return data
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


# What FrameReader.next yields besides a message: a ping to answer, the
# peer's close.
PING, CLOSE, MESSAGE = "ping", "close", "message"


class FrameReader:
    """Reassembles the server's frames from the bytes fed to it. next()
    returns (MESSAGE, opcode, payload) for each whole data message,
    (PING, 0, payload) for a ping to answer with a pong, (CLOSE, 0,
    payload) for the server's close, and None while it needs more bytes.
    A message past MAX_MESSAGE raises ConnectionClosed."""

    def __init__(self, initial: bytes = b"") -> None:
        self.buf = bytearray(initial)
        self._op: Optional[int] = None
        self._parts: List[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> None:
        self.buf += data

    def want(self) -> int:
        """How many more bytes the frame being read needs, at least 1."""
        need = self._need()
        return max(need - len(self.buf), 1) if need else 1

    def _need(self) -> int:
        b = self.buf
        if len(b) < 2:
            return 2
        n, at = b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return 4
            n, at = struct.unpack("!H", bytes(b[2:4]))[0], 4
        elif n == 127:
            if len(b) < 10:
                return 10
            n, at = struct.unpack("!Q", bytes(b[2:10]))[0], 10
        if n > MAX_MESSAGE or self._size + n > MAX_MESSAGE:
            raise ConnectionClosed("message too large")
        return at + (4 if b[1] & 0x80 else 0) + n

    def next(self) -> Optional[Tuple[str, int, bytes]]:
        while True:
            need = self._need()
            if len(self.buf) < need:
                return None
            b0, b1 = self.buf[0], self.buf[1]
            n = b1 & 0x7F
            at = 2 + (2 if n == 126 else 8 if n == 127 else 0)
            mask = bytes(self.buf[at:at + 4]) if b1 & 0x80 else None
            data = bytes(self.buf[at + (4 if mask else 0):need])
            del self.buf[:need]
            if mask:
                data = mask_bytes(data, mask)
            fin, op = b0 & 0x80, b0 & 0x0F
            if op == OP_PING:
                return PING, 0, data
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                return CLOSE, 0, data
            if op != OP_CONT:
                self._op = op
            self._parts.append(data)
            self._size += len(data)
            if fin:
                msg = b"".join(self._parts)
                op_, self._op, self._parts, self._size = self._op, None, [], 0
                return MESSAGE, op_ if op_ is not None else OP_BINARY, msg


def pong_frame(payload: bytes) -> bytes:
    return encode_frame(OP_PONG, payload)


def close_reply(payload: bytes) -> bytes:
    return encode_frame(OP_CLOSE, payload[:2])



# -- file operations (docs/api.md "File operations") ----------------------

def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


@dataclass(frozen=True)
class FileEntry:
    """One file as lstat says of it (api.FileEntry): type is "file",
    "dir", "symlink" or "other"; mode the permission bits with setuid,
    setgid and sticky (0o644); mtime an aware datetime in UTC, to the
    second. path is set on the answers of stat, mkdir and rename, "" in a
    listing."""

    name: str
    type: str
    size: int = 0
    mode: int = 0
    mtime: Optional[datetime.datetime] = None
    path: str = ""

    @classmethod
    def from_json(cls, data: Any) -> "FileEntry":
        """The entry of an answer; one without a string name and type
        raises HiloopError (code bad_answer)."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or \
                not isinstance(data.get("type"), str):
            raise HiloopError("the answer is not a file entry", code="bad_answer")
        return cls(data["name"], data["type"], _int(data.get("size")) or 0, (_int(data.get("mode")) or 0) & 0o7777,
                   parse_time(data.get("mtime")), _str(data.get("path")))

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass(frozen=True)
class FileList:
    """A directory's entries sorted by name (api.FileList); truncated
    when the directory held more than the server lists (10,000)."""

    path: str
    entries: List[FileEntry]
    truncated: bool = False

    @classmethod
    def from_json(cls, data: Any) -> "FileList":
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise HiloopError("the answer is not a directory listing", code="bad_answer")
        return cls(_str(data.get("path")), [FileEntry.from_json(e) for e in data["entries"]],
                   data.get("truncated") is True)

    def __iter__(self) -> Any:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


# How long a file operation's answer may take: the server's limit of one
# operation (api.FSTimeout, 10 minutes) and a margin.
FS_WAIT = 600.0 + RUN_MARGIN


def fs_path(sandbox_id: str, op: str, wake: bool, **q: Union[str, bytes]) -> str:
    if wake:
        q["wake"] = "true"
    return sandbox_path(sandbox_id, "/fs/" + op + ("?" + urlencode(q) if q else ""))


def query_path(path: str) -> bytes:
    """A path for the query, which takes any byte: a name that is not
    UTF-8 (os.fsdecode's surrogate escapes) goes as its own bytes."""
    return path.encode("utf-8", "surrogateescape")


def body_path(name: str, path: str) -> str:
    """A path for a JSON body, which is UTF-8: one that is not (a
    surrogate escape of a name's raw byte) would reach the server as
    U+FFFD or a refusal, so it is refused here (invalid_path, naming
    name), as the Go client does; such a file is removed or renamed with
    exec."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise error_for(400, "invalid_path", "%s: not valid UTF-8, which a JSON body cannot carry" % name,
                        field=name) from None
    return path


def fs_list_call(sandbox_id: str, path: str, wake: bool) -> Call:
    return json_call("GET", fs_path(sandbox_id, "list", wake, path=query_path(path)),
                     timeout=FS_WAIT + (WAKE_WAIT if wake else 0))


def fs_stat_call(sandbox_id: str, path: str, wake: bool) -> Call:
    return json_call("GET", fs_path(sandbox_id, "stat", wake, path=query_path(path)),
                     timeout=FS_WAIT + (WAKE_WAIT if wake else 0))


def fs_change_call(sandbox_id: str, op: str, req: Dict[str, Any], wake: bool) -> Call:
    """POST .../fs/remove, mkdir or rename, its paths checked as
    body_path does."""
    for name in ("path", "from", "to"):
        if isinstance(req.get(name), str):
            body_path(name, req[name])
    return json_call("POST", fs_path(sandbox_id, op, wake), req, timeout=FS_WAIT + (WAKE_WAIT if wake else 0))


def exists_answer(err: HiloopError) -> bool:
    """exists' answer to a refused stat: False for file_not_found; any
    other refusal (a sandbox's not_found included) raises."""
    if err.code == "file_not_found":
        return False
    raise err



# -- background processes (docs/api.md "Background processes") -----------

OUTPUT_OFFSET_HEADER = "hiloop-output-offset"
# The signals a process may be sent (api.ProcessSignals).
PROCESS_SIGNALS = ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT")
# The most bytes one write_stdin sends (api.MaxProcessStdin).
MAX_PROCESS_STDIN = 64 << 10
# How long a quiet follow of a process's output is waited on: the server
# ends a follow after 24 hours.
FOLLOW_WAIT = MAX_EXEC_TIMEOUT + EXEC_MARGIN
# How long wait and attach pause before asking again after a cut.
REATTACH_PAUSE = 1.0
# How many cuts in a row that read nothing attach takes before it raises.
MAX_EMPTY_CUTS = 5


@dataclass(frozen=True)
class Process:
    """A background process (api.Process): state is "running", "exited"
    (exit_code set: its status, or 128 plus the signal's number) or
    "ended" (gone without an exit status; reason says why).
    output_bytes is how much it has written in all, as the sandbox said,
    None when it was not asked."""

    id: str
    sandbox_id: str = ""
    command: List[str] = field(default_factory=list)
    state: str = ""
    exit_code: Optional[int] = None
    reason: str = ""
    started_at: Optional[datetime.datetime] = None
    ended_at: Optional[datetime.datetime] = None
    output_bytes: Optional[int] = None

    @classmethod
    def from_json(cls, data: Any) -> "Process":
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise HiloopError("the answer is not a process", code="bad_answer")
        cmd = data.get("command")
        return cls(data["id"], _str(data.get("sandbox_id")),
                   [str(a) for a in cmd] if isinstance(cmd, list) else [], _str(data.get("state")),
                   _int(data.get("exit_code")), _str(data.get("reason")), parse_time(data.get("started_at")),
                   parse_time(data.get("ended_at")), _int(data.get("output_bytes")))

    @property
    def running(self) -> bool:
        return self.state == "running"


def process_path(sandbox_id: str, pid: str, rest: str = "") -> str:
    return sandbox_path(sandbox_id, "/processes/" + quote(pid, safe="") + rest)


def process_start_call(sandbox_id: str, cmd: Command, wake: bool, env: Optional[Mapping[str, str]] = None,
                       cwd: Optional[str] = None) -> Call:
    """POST .../processes, with the variables added to the process's
    environment and the directory it starts in, when given: sent once,
    never retried on a dead connection (it may have started the command)."""
    path = sandbox_path(sandbox_id, "/processes" + ("?wake=true" if wake else ""))
    return json_call("POST", path, command_request(cmd, env, cwd), timeout=RUN_MARGIN + (WAKE_WAIT if wake else 0))


def processes_items(data: Any) -> List[Process]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise HiloopError("the answer is not a list of processes", code="bad_answer")
    return [Process.from_json(p) for p in data["items"]]


def signal_call(sandbox_id: str, pid: str, signal: str) -> Call:
    sig = signal.upper()
    if sig.startswith("SIG"):
        sig = sig[3:]
    return json_call("POST", process_path(sandbox_id, pid, "/signal"), {"signal": sig})


def stdin_call(sandbox_id: str, pid: str, data: Union[bytes, str], close: bool) -> Call:
    """POST .../stdin with the raw bytes (text as UTF-8): sent once, never
    retried (it may have reached the process)."""
    b = data.encode() if isinstance(data, str) else bytes(data)
    if len(b) > MAX_PROCESS_STDIN:
        raise ValueError("write_stdin sends at most %d bytes at a time, not %d" % (MAX_PROCESS_STDIN, len(b)))
    path = process_path(sandbox_id, pid, "/stdin" + ("?close=true" if close else ""))
    return Call("POST", path, b, {"Content-Type": "application/octet-stream"})


def output_call(sandbox_id: str, pid: str, offset: int, follow: bool) -> Call:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError("offset: want a byte offset, 0 or more")
    q = {"offset": str(offset)}
    if follow:
        q["follow"] = "true"
    return Call("GET", process_path(sandbox_id, pid, "/output?" + urlencode(q)))


def output_start(headers: Mapping[str, str], offset: int) -> int:
    """The offset an output's body begins at (Hiloop-Output-Offset;
    headers' names lower case), else the one asked."""
    v = headers.get(OUTPUT_OFFSET_HEADER, "")
    return int(v) if v.isdigit() else offset


def reattach(err: BaseException) -> bool:
    """Reports whether wait or attach asks again after err: a cut body, or
    output that moved on or ended with its process (the process's state
    then tells)."""
    if isinstance(err, HiloopError):
        return err.code in ("output_gone", "process_not_running", "stream_lost")
    return isinstance(err, (OSError, http_client.HTTPException))


def attach_over(p: Process, cut: BaseException, empty_cuts: int) -> bool:
    """Reports whether attach is over after the cut, p the process as it
    stands since, empty_cuts how many cuts in a row read nothing: it is
    when the process no longer runs. Output that moved on past the offset
    while it runs raises (bytes were lost), as does the cut after
    MAX_EMPTY_CUTS that read nothing (a server that cannot serve it)."""
    if not p.running:
        return True
    if isinstance(cut, HiloopError) and cut.code == "output_gone" or empty_cuts > MAX_EMPTY_CUTS:
        raise cut
    return False


# -- previews (docs/api.md "Previews") ------------------------------------

@dataclass(frozen=True)
class Preview:
    """A URL that serves a TCP port of a sandbox (api.Preview). url is
    where to visit; the answer to a create of a token preview carries the
    token in it (and in token), and only that answer does. auth is
    "token" or "key" (a visitor sends an API key of the organization)."""

    id: str
    sandbox_id: str = ""
    port: int = 0
    auth: str = ""
    url: str = ""
    token: str = ""
    created_at: Optional[datetime.datetime] = None
    expires_at: Optional[datetime.datetime] = None

    def __repr__(self) -> str:
        # The token stays out of logs and tracebacks: in url too.
        url = self.url.replace(self.token, "...") if self.token else self.url
        return "Preview(id=%r, sandbox_id=%r, port=%r, auth=%r, url=%r, expires_at=%r)" % (
            self.id, self.sandbox_id, self.port, self.auth, url, self.expires_at)

    @classmethod
    def from_json(cls, data: Any) -> "Preview":
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not isinstance(data.get("url"), str):
            raise HiloopError("the answer is not a preview", code="bad_answer")
        return cls(data["id"], _str(data.get("sandbox_id")), _int(data.get("port")) or 0, _str(data.get("auth")),
                   data["url"], _str(data.get("token")), parse_time(data.get("created_at")),
                   parse_time(data.get("expires_at")))


def preview_create_call(sandbox_id: str, port: int, auth: str, ttl: Optional[Duration]) -> Call:
    """POST .../previews: sent once, never retried (a second try would make
    a second preview)."""
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError("port: want an int, not %s" % type(port).__name__)
    req: Dict[str, Any] = {"port": port, "auth": auth}
    if ttl is not None:
        req["ttl"] = duration(ttl, "ttl")
    return json_call("POST", sandbox_path(sandbox_id, "/previews"), req)


def previews_items(data: Any) -> List[Preview]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise HiloopError("the answer is not a list of previews", code="bad_answer")
    return [Preview.from_json(p) for p in data["items"]]


def preview_path(sandbox_id: str, preview_id: str) -> str:
    return sandbox_path(sandbox_id, "/previews/" + quote(preview_id, safe=""))
