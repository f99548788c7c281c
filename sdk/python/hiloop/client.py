"""hiloop's Python client: sandboxes, commands and files, over the HTTP API
and the exec WebSocket, with the standard library alone."""

import errno
import http.client
import io
import ipaddress
import json
import os
import shutil
import socket
import ssl
import tarfile
import tempfile
import threading
import time
import uuid
from typing import (IO, Any, BinaryIO, Callable, Dict, Iterator, List, Mapping, Optional, Sequence,
                    Union)
from urllib.parse import quote, urlencode, urlsplit

from . import _tar, _ws
from .errors import ConflictError, HiloopError, LimitError, StreamLostError, WaitError, error_for

EXEC_SUBPROTOCOL = "hiloop.exec.v1"
CHAN_STDIN, CHAN_STDOUT, CHAN_STDERR, CHAN_EXIT, CHAN_RESIZE, CHAN_CLOSE_IN = 0, 1, 2, 3, 4, 255
TAR_MEDIA_TYPE = "application/x-tar"

# States from which waiting for another cannot succeed.
_FAILED = {"exited", "expired", "deleted", "lost", "attention", "quarantined", "failed"}

Command = Union[str, Sequence[str]]

# How much longer than its own time a call that may wake a sandbox waits:
# serve's --wake-timeout, by default.
_WAKE_WAIT = 120.0

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
_MAX_ANSWER = 32 << 20
# How long exec waits for the upgrade (plus _WAKE_WAIT when it may wake),
# and how much longer than the command's timeout for its exit status, the
# server's own delays (reaching the cluster, the exit frame) included; run
# waits the same margin for its answer.
_HANDSHAKE_WAIT = 30.0
_EXEC_MARGIN = 60.0
_RUN_MARGIN = 60.0
# The server's longest command (api.MaxExecTimeout), an exec's without a
# timeout.
_MAX_EXEC_TIMEOUT = 24 * 3600.0


def _is_loopback(host: str) -> bool:
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


class _Deadline:
    """Shuts a connection's socket down once seconds have passed, so an
    answer trickled in a byte at a time, each within the socket's timeout,
    still cannot hold the call past them."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.fired = False
        self._conn = conn
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self._timer.cancel()


def _check_whole(resp: http.client.HTTPResponse) -> None:
    """Raises IncompleteRead for a body that ended before its
    Content-Length, which HTTPResponse.read(n) returns short."""
    if resp.length:
        raise http.client.IncompleteRead(b"", resp.length)


def _read_capped(resp: http.client.HTTPResponse, cap: int, what: str) -> bytes:
    """The body of resp, refused with LimitError past cap bytes."""
    parts: List[bytes] = []
    n = 0
    while True:
        b = resp.read(min(1 << 20, cap + 1 - n))
        if not b:
            _check_whole(resp)
            return b"".join(parts)
        n += len(b)
        if n > cap:
            raise LimitError("%s is larger than %d bytes" % (what, cap), code="output_limit")
        parts.append(b)


def _argv(cmd: Command) -> List[str]:
    """A string runs through sh -c; a list is the argv as is."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    return list(cmd)


class CommandResult:
    """How a command ended: its exit code (128+n for a death by signal n,
    with signal naming it), or timed_out with exit_code None."""

    def __init__(self, exit_code: Optional[int], stdout: bytes, stderr: bytes, timed_out: bool = False,
                 signal: str = "") -> None:
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.signal = signal

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def __repr__(self) -> str:
        return "CommandResult(exit_code=%r, timed_out=%r, signal=%r, stdout=%r, stderr=%r)" % (
            self.exit_code, self.timed_out, self.signal, self.stdout[:80], self.stderr[:80])


class Client:
    """A client of the hiloop API at url (HILOOP_URL, else hiloop dev's
    http://127.0.0.1:8080) with the key token (HILOOP_TOKEN)."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, timeout: float = 120.0,
                 max_retries: int = 4, ssl_context: Optional[ssl.SSLContext] = None, wake: bool = True) -> None:
        # wake: run, exec and the file calls start a sandbox stopped for
        # idleness and wait for it (?wake=true, up to the server's wake
        # timeout); with wake=False such a sandbox raises ConflictError
        # (sandbox_not_running). A sandbox its owner stopped is never woken.
        self.wake = wake
        self.url = (url or os.environ.get("HILOOP_URL") or "http://127.0.0.1:8080").rstrip("/")
        self.token = token or os.environ.get("HILOOP_TOKEN", "")
        self.timeout = timeout
        self.max_retries = max_retries
        self.ssl_context = ssl_context
        u = urlsplit(self.url)
        if u.scheme not in ("http", "https"):
            raise ValueError("HILOOP_URL %r: want http:// or https://" % self.url)
        if u.scheme == "http" and not _is_loopback(u.hostname or ""):
            raise ValueError("refusing to send the API key over plain http:// to %s; use https://" % u.netloc)
        self._u = u
        self.sandboxes = Sandboxes(self)

    # -- HTTP -------------------------------------------------------------

    def _conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._u.scheme == "https":
            return http.client.HTTPSConnection(self._u.hostname or "", self._u.port, timeout=timeout,
                                               context=self.ssl_context, blocksize=1 << 20)
        return http.client.HTTPConnection(self._u.hostname or "", self._u.port, timeout=timeout, blocksize=1 << 20)

    def _open(self, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None,
              timeout: Optional[float] = None, rewind: Optional[Callable[[], Any]] = None,
              once: bool = False, deadline: bool = False) -> http.client.HTTPResponse:
        """Sends a request and returns the response of a status below 400;
        an error status raises its HiloopError. A 429 or 503 with
        Retry-After is retried after the wait it asks, unless the body
        cannot be sent again. timeout bounds each read and write (the
        client's timeout when None); with deadline it bounds the whole
        exchange as well, the answer's body included (resp._hiloop_deadline
        until the caller closes), and a call past it raises TimeoutError."""
        hdrs = {"Authorization": "Bearer " + self.token} if self.token else {}
        hdrs.update(headers or {})
        wait = timeout if timeout is not None else self.timeout
        attempt = 0
        while True:
            conn = self._conn(wait)
            dl = _Deadline(conn, wait) if deadline else None
            try:
                conn.request(method, self._u.path.rstrip("/") + path, body=body, headers=hdrs)
                if dl is not None and dl.fired:
                    raise TimeoutError()
                resp = conn.getresponse()
                if resp.status < 400:
                    resp._hiloop_conn = conn  # type: ignore[attr-defined]
                    resp._hiloop_deadline = dl  # type: ignore[attr-defined]
                    return resp
                err = _read_error(resp)
            except Exception as e:
                conn.close()
                if dl is not None:
                    dl.cancel()
                    _raise_if_late(dl, e, method, path, wait)
                raise
            conn.close()
            if dl is not None:
                dl.cancel()
            if once or attempt >= self.max_retries or err.retry_after is None:
                raise err
            time.sleep(min(err.retry_after, 60.0))
            attempt += 1
            if rewind is not None:
                body = rewind()

    def _json(self, method: str, path: str, payload: Any = None, headers: Optional[Dict[str, str]] = None,
              timeout: Optional[float] = None) -> Any:
        body = None
        hdrs = dict(headers or {})
        if payload is not None:
            body = json.dumps(payload).encode()
            hdrs["Content-Type"] = "application/json"
        resp = self._open(method, path, body, hdrs, timeout, deadline=True)
        dl: _Deadline = resp._hiloop_deadline  # type: ignore[attr-defined]
        try:
            data = _read_capped(resp, _MAX_ANSWER, "the answer to %s %s" % (method, path.split("?")[0]))
        except Exception as e:
            _raise_if_late(dl, e, method, path, timeout if timeout is not None else self.timeout)
            raise
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]
            dl.cancel()
        if resp.status == 204 or not data:
            return None
        return json.loads(data)

    def org(self) -> Dict[str, Any]:
        """The caller's organization and its quotas."""
        return self._json("GET", "/v1/org")


def _raise_if_late(dl: _Deadline, e: BaseException, method: str, path: str, wait: float) -> None:
    """Raises TimeoutError for e when the deadline dl cut the call."""
    if dl.fired and isinstance(e, (OSError, http.client.HTTPException)):
        raise TimeoutError("%s %s: no whole answer within %gs" % (method, path.split("?")[0], wait)) from None


def _read_error(resp: http.client.HTTPResponse) -> HiloopError:
    data = resp.read(64 << 10)
    code, message, field, request_id = "http_%d" % resp.status, data.decode("utf-8", "replace").strip(), "", ""
    try:
        e = json.loads(data)["error"]
        code, message = e["code"], e.get("message", "")
        field, request_id = e.get("field", ""), e.get("request_id", "")
    except (ValueError, KeyError, TypeError):
        pass
    request_id = request_id or resp.getheader("X-Request-Id", "") or ""
    retry_after = None
    ra = resp.getheader("Retry-After")
    if resp.status in (429, 503) and ra is not None:
        try:
            retry_after = max(float(ra), 0.1)
        except ValueError:
            retry_after = 1.0
    return error_for(resp.status, code, message, request_id, field, retry_after)


class Sandboxes:
    """client.sandboxes: create, get and list sandboxes."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, image: str, ttl: Optional[str] = None, volumes: Optional[Sequence[Mapping[str, str]]] = None,
               labels: Optional[Mapping[str, str]] = None, transports: Optional[Sequence[str]] = None,
               resources: Optional[Mapping[str, str]] = None, shutdown_policy: Optional[str] = None,
               idle_timeout: Optional[str] = None, wait: bool = True, wait_timeout: float = 300.0,
               idempotency_key: Optional[str] = None) -> "Sandbox":
        """Creates a sandbox and, with wait, waits until it runs. Every try
        of the call carries one Idempotency-Key, so retries make one
        sandbox."""
        req: Dict[str, Any] = {"image": image}
        for k, v in (("ttl", ttl), ("volumes", volumes), ("labels", labels), ("transports", transports),
                     ("resources", resources), ("shutdown_policy", shutdown_policy), ("idle_timeout", idle_timeout)):
            if v is not None:
                req[k] = list(v) if k in ("volumes", "transports") else (dict(v) if isinstance(v, Mapping) else v)
        key = idempotency_key or uuid.uuid4().hex
        sb = Sandbox(self._c, self._c._json("POST", "/v1/sandboxes", req, {"Idempotency-Key": key}))
        if wait:
            sb.wait("running", timeout=wait_timeout)
        return sb

    def get(self, sandbox_id: str) -> "Sandbox":
        return Sandbox(self._c, self._c._json("GET", "/v1/sandboxes/" + quote(sandbox_id, safe="")))

    def list(self, state: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
             limit: Optional[int] = None) -> Iterator["Sandbox"]:
        """Iterates over every sandbox the filters select, page by page."""
        after = ""
        while True:
            q: List[Any] = []
            if state:
                q.append(("state", state))
            for k, v in (labels or {}).items():
                q.append(("label", "%s=%s" % (k, v)))
            if limit:
                q.append(("limit", str(limit)))
            if after:
                q.append(("after", after))
            page = self._c._json("GET", "/v1/sandboxes" + ("?" + urlencode(q) if q else ""))
            for item in page["items"]:
                yield Sandbox(self._c, item)
            after = page.get("next", "")
            if not after:
                return


class Sandbox:
    """One sandbox. As a context manager it deletes the sandbox on exit."""

    def __init__(self, client: Client, data: Dict[str, Any]) -> None:
        self._c = client
        self.data = data
        self.id: str = data["id"]
        self.files = Files(self)

    @property
    def state(self) -> str:
        return self.data["state"]

    def __repr__(self) -> str:
        return "Sandbox(%s, %s)" % (self.id, self.state)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete()

    def _path(self, rest: str = "") -> str:
        return "/v1/sandboxes/" + quote(self.id, safe="") + rest

    def _set(self, data: Dict[str, Any]) -> "Sandbox":
        self.data = data
        return self

    def refresh(self) -> "Sandbox":
        return self._set(self._c._json("GET", self._path()))

    def stop(self) -> "Sandbox":
        return self._set(self._c._json("POST", self._path("/stop")))

    def start(self) -> "Sandbox":
        return self._set(self._c._json("POST", self._path("/start")))

    def delete(self) -> "Sandbox":
        return self._set(self._c._json("DELETE", self._path()))

    def events(self) -> List[Dict[str, Any]]:
        return self._c._json("GET", self._path("/events"))["items"]

    def wait(self, state: str = "running", timeout: float = 300.0) -> "Sandbox":
        """Waits on the long poll until the sandbox is in state; WaitError
        when it reaches a state that will not lead there, TimeoutError
        past timeout."""
        deadline = time.monotonic() + timeout
        self.refresh()
        while self.state != state:
            if self.state in _FAILED or (state == "running" and self.data.get("desired") != "running"):
                raise WaitError("sandbox %s is %s (%s), waiting for %s" % (
                    self.id, self.state, self.data.get("reason", ""), state), code="wait_failed")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out waiting for %s; sandbox %s is %s" % (state, self.id, self.state))
            wait = max(1, min(30, int(left)))
            before = self.state
            asked = time.monotonic()
            self._set(self._c._json("GET", self._path("?" + urlencode({"while": before, "wait": "%ds" % wait})),
                                    timeout=wait + 30))
            if self.state == before and time.monotonic() - asked < wait:
                time.sleep(0.2)
        return self

    def run(self, cmd: Command, timeout: Optional[float] = None,
            stdin: Optional[Union[str, bytes]] = None) -> CommandResult:
        """Runs a one-shot command (POST .../exec/run): each of stdout and
        stderr holds up to 1 MiB. A command past timeout (seconds) comes
        back with timed_out, not an exception."""
        req: Dict[str, Any] = {"command": _argv(cmd)}
        if timeout is not None:
            req["timeout"] = "%dms" % int(timeout * 1000)
        if stdin is not None:
            req["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
        path, wait = self._path("/exec/run"), (timeout or 60) + _RUN_MARGIN
        if self._c.wake:
            path, wait = path + "?wake=true", wait + _WAKE_WAIT
        res = self._c._json("POST", path, req, timeout=wait)
        return CommandResult(res.get("exit_code"), res["stdout"].encode(), res["stderr"].encode(),
                             res["timed_out"], res.get("signal", ""))

    def exec(self, cmd: Command, on_stdout: Optional[Callable[[bytes], None]] = None,
             on_stderr: Optional[Callable[[bytes], None]] = None, timeout: Optional[float] = None,
             stdin: Optional[Union[bytes, BinaryIO]] = None, max_output: int = MAX_OUTPUT) -> CommandResult:
        """Runs a command over the exec WebSocket, calling on_stdout and
        on_stderr with each chunk as it comes (without them the output is
        collected in the result, up to max_output bytes each: past that,
        LimitError with code output_limit). A stream that breaks before the
        exit status raises StreamLostError, as does a server that sends no
        exit status within timeout (the server's 24h without one) and a
        minute; a command past timeout comes back with timed_out."""
        q: Dict[str, str] = {}
        if stdin is not None:
            q["stdin"] = "true"
        if timeout is not None:
            q["timeout"] = "%dms" % int(timeout * 1000)
        handshake = _HANDSHAKE_WAIT
        if self._c.wake:
            q["wake"] = "true"
            handshake += _WAKE_WAIT
        url = self._c.url + self._path("/exec") + ("?" + urlencode(q) if q else "")
        headers = {"Authorization": "Bearer " + self._c.token}
        attempt = 0
        while True:
            try:
                ws = _ws.WebSocket.connect(url, headers, EXEC_SUBPROTOCOL, timeout=handshake,
                                           ssl_context=self._c.ssl_context)
                break
            except _ws.HandshakeError as e:
                err = _handshake_error(e)
                if attempt >= self._c.max_retries or err.retry_after is None:
                    raise err
                time.sleep(min(err.retry_after, 60.0))
                attempt += 1
            except _ws.ConnectionClosed as e:
                raise StreamLostError("the exec stream ended before it began: %s" % e, code="stream_lost") from None
        ws.deadline = time.monotonic() + (timeout if timeout is not None else _MAX_EXEC_TIMEOUT) + _EXEC_MARGIN
        out, errs = bytearray(), bytearray()

        def lost(e: Exception) -> StreamLostError:
            if ws.deadline is not None and time.monotonic() >= ws.deadline:
                e = TimeoutError("no exit status within the command's timeout and %gs" % _EXEC_MARGIN)
            return StreamLostError("the exec stream ended without an exit status: %s" % e, code="stream_lost")

        def collect(buf: bytearray, payload: bytes, name: str) -> None:
            if len(buf) + len(payload) > max_output:
                raise LimitError("the command's %s passed max_output (%d bytes); pass on_%s to take more" % (
                    name, max_output, name), code="output_limit")
            buf.extend(payload)

        try:
            try:
                ws.send(_ws.OP_TEXT, json.dumps({"command": _argv(cmd)}).encode())
            except (_ws.ConnectionClosed, OSError) as e:
                raise lost(e) from None
            if stdin is not None:
                data = stdin if isinstance(stdin, bytes) else None
                reader = io.BytesIO(data) if data is not None else stdin
                while True:
                    chunk = reader.read(32 << 10)  # type: ignore[union-attr]
                    try:
                        if not chunk:
                            ws.send(_ws.OP_BINARY, bytes([CHAN_CLOSE_IN, CHAN_STDIN]))
                            break
                        ws.send(_ws.OP_BINARY, bytes([CHAN_STDIN]) + chunk)
                    except (_ws.ConnectionClosed, OSError) as e:
                        raise lost(e) from None
            while True:
                try:
                    op, msg = ws.recv()
                except (_ws.ConnectionClosed, OSError) as e:
                    raise lost(e) from None
                if op != _ws.OP_BINARY or not msg:
                    continue
                ch, payload = msg[0], msg[1:]
                if ch == CHAN_STDOUT:
                    on_stdout(payload) if on_stdout else collect(out, payload, "stdout")
                elif ch == CHAN_STDERR:
                    on_stderr(payload) if on_stderr else collect(errs, payload, "stderr")
                elif ch == CHAN_EXIT:
                    return _exit_result(payload, bytes(out), bytes(errs))
        finally:
            ws.close()


def _exit_result(payload: bytes, out: bytes, errs: bytes) -> CommandResult:
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
        raise error_for(_stream_status(code), code, str(e.get("message", "")), str(e.get("request_id", "")))
    code = f.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool):
        raise StreamLostError("the exit frame carried no exit code", code="stream_lost")
    return CommandResult(code, out, errs, signal=str(f.get("signal", "")))


def _handshake_error(e: "_ws.HandshakeError") -> HiloopError:
    code, message, request_id = "http_%d" % e.status, e.body.decode("utf-8", "replace"), ""
    try:
        d = json.loads(e.body)["error"]
        code, message, request_id = d["code"], d.get("message", ""), d.get("request_id", "")
    except (ValueError, KeyError, TypeError):
        pass
    retry_after = None
    if e.status in (429, 503) and "retry-after" in e.headers:
        try:
            retry_after = max(float(e.headers["retry-after"]), 0.1)
        except ValueError:
            retry_after = 1.0
    return error_for(e.status, code, message, request_id or e.headers.get("x-request-id", ""),
                     retry_after=retry_after)


def _stream_status(code: str) -> int:
    """The HTTP status the code has outside a stream, for its family."""
    return {"session_ended": 409, "exec_failed": 502, "cluster_unavailable": 503,
            "invalid_frame": 400}.get(code, 500)


class Files:
    """sb.files: files and directories in and out of the sandbox, through
    the exec path, as the image's own user."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _path(self, path: str, **extra: str) -> str:
        if self._sb._c.wake:
            extra["wake"] = "true"
        return self._sb._path("/files?" + urlencode(dict(path=path, **extra)))

    def write(self, path: str, data: Union[bytes, str, BinaryIO], mode: Optional[int] = None) -> Dict[str, Any]:
        """Writes bytes, text (UTF-8) or a binary file object to path,
        atomically: a cut upload leaves the old file whole. Returns the
        path, size and sha256 the server received."""
        extra = {"mode": "%04o" % mode} if mode is not None else {}
        if isinstance(data, str):
            data = data.encode()
        if isinstance(data, (bytes, bytearray)):
            size, body = len(data), bytes(data)
            rewind = None
        else:
            start = data.tell()
            data.seek(0, io.SEEK_END)
            size = data.tell() - start
            data.seek(start)
            body = data  # type: ignore[assignment]

            def rewind() -> Any:
                data.seek(start)  # type: ignore[union-attr]
                return data
        return self._upload(self._path(path, **extra), "application/octet-stream", body, size, rewind)

    def _upload(self, path: str, content_type: str, body: Any, size: int,
                rewind: Optional[Callable[[], Any]]) -> Dict[str, Any]:
        resp = self._sb._c._open("PUT", path, body, {"Content-Type": content_type, "Content-Length": str(size)},
                                 timeout=None, rewind=rewind)
        try:
            return json.loads(resp.read())
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]

    def open(self, path: str) -> http.client.HTTPResponse:
        """Opens path for reading: a file's bytes, or a directory's tar
        stream (Content-Type application/x-tar). Close it. A server
        silent for the client's timeout (plus a wake's, when it may wake
        the sandbox) ends the read with TimeoutError."""
        c = self._sb._c
        return c._open("GET", self._path(path), timeout=c.timeout + (_WAKE_WAIT if c.wake else 0))

    def read(self, path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
        """Reads the file at path whole, into memory; a transfer that
        breaks midway raises, never returns short. A file larger than
        max_bytes raises LimitError (output_limit): read_to streams one."""
        resp = self.open(path)
        try:
            if resp.getheader("Content-Type", "").startswith(TAR_MEDIA_TYPE):
                raise ConflictError("%s is a directory; use download_dir" % path, code="path_conflict", status=409)
            return _read_capped(resp, max_bytes, "the file %s" % path)
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]

    def read_to(self, path: str, out: IO[bytes]) -> int:
        """Streams the file at path into out; returns the bytes copied."""
        resp = self.open(path)
        try:
            n = 0
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                n += len(chunk)
            _check_whole(resp)
            return n
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]

    def upload_dir(self, local: str, path: str) -> Dict[str, Any]:
        """Copies the local directory into the directory at path (made if
        missing), as a tar stream; the image needs tar. The tar names no
        owner (uid and gid 0, no user or group names), so nothing of the
        local accounts reaches the sandbox, and tar there makes the files
        the image's user's."""
        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
                for entry in sorted(os.listdir(local)):
                    tf.add(os.path.join(local, entry), arcname=entry, filter=_no_owner)
            size = f.tell()
            f.seek(0)

            def rewind() -> Any:
                f.seek(0)
                return f
            return self._upload(self._path(path), TAR_MEDIA_TYPE, f, size, rewind)

    def download_dir(self, path: str, local: str, overwrite: bool = False, max_bytes: int = MAX_FILE_BYTES,
                     max_entries: int = MAX_ENTRIES) -> None:
        """Copies the directory at path into a new local directory, local
        (its parents made if missing); FileExistsError if local exists. It
        is written as a temporary directory .hiloop-<hex> beside local and
        renamed into place once whole, so a failed download leaves nothing.

        With overwrite=True an existing local is written into instead: its
        other files stay, a file the download names is replaced (renamed
        over, never written through a link), and a failed download leaves
        what it wrote so far.

        What the sandbox sends is not trusted. Only directories and regular
        files are written, each inside local: an entry naming a path
        outside, or through a symbolic link (one already in local
        included), raises ExtractError, as do a sparse file, a name written
        twice and a stream that is not a whole tar. Links, devices and
        fifos are skipped. Modes are the tar's permission bits less the
        umask, never setuid, setgid or sticky. More than max_bytes of
        content or max_entries entries raises LimitError (extract_limit).
        Needs a POSIX system (os.open with dir_fd)."""
        dest = os.path.abspath(local)
        exists = os.path.lexists(dest)
        if exists and not overwrite:
            raise FileExistsError(errno.EEXIST, "download_dir writes a new directory (overwrite=True writes into "
                                                "an existing one)", local)
        resp = self.open(path)
        try:
            if not resp.getheader("Content-Type", "").startswith(TAR_MEDIA_TYPE):
                raise ConflictError("%s is a file, not a directory" % path, code="path_conflict", status=409)
            if exists:
                _tar.extract(resp, dest, True, max_bytes, max_entries)  # type: ignore[arg-type]
                return
            parent = os.path.dirname(dest)
            os.makedirs(parent, exist_ok=True)
            tmp = _tar.make_temp_dir(parent)
            try:
                _tar.extract(resp, tmp, False, max_bytes, max_entries)  # type: ignore[arg-type]
                # A directory made at local meanwhile is not merged into:
                # the rename fails on anything but an empty one.
                if os.path.lexists(dest):
                    raise FileExistsError(errno.EEXIST, "made while download_dir wrote it", local)
                os.rename(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]


def _no_owner(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti
