"""hiloop's Python client: sandboxes, commands and files, over the HTTP API
and the exec WebSocket, with the standard library alone."""

import http.client
import io
import json
import os
import shutil
import ssl
import tarfile
import tempfile
import time
import uuid
from typing import (IO, Any, BinaryIO, Callable, Dict, Iterator, List, Mapping, Optional, Sequence,
                    Union)
from urllib.parse import quote, urlencode, urlsplit

from . import _ws
from .errors import (ConflictError, HiloopError, InvalidRequestError, StreamLostError, WaitError,
                     error_for)

EXEC_SUBPROTOCOL = "hiloop.exec.v1"
CHAN_STDIN, CHAN_STDOUT, CHAN_STDERR, CHAN_EXIT, CHAN_RESIZE, CHAN_CLOSE_IN = 0, 1, 2, 3, 4, 255
TAR_MEDIA_TYPE = "application/x-tar"

# States from which waiting for another cannot succeed.
_FAILED = {"exited", "expired", "deleted", "lost", "attention", "quarantined", "failed"}

Command = Union[str, Sequence[str]]

# How much longer than its own time a call that may wake a sandbox waits:
# serve's --wake-timeout, by default.
_WAKE_WAIT = 120.0


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
        if u.scheme == "http" and u.hostname not in ("localhost",) and not (u.hostname or "").startswith("127.") \
                and u.hostname != "::1":
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
              once: bool = False) -> http.client.HTTPResponse:
        """Sends a request and returns the response of a status below 400;
        an error status raises its HiloopError. A 429 or 503 with
        Retry-After is retried after the wait it asks, unless the body
        cannot be sent again."""
        hdrs = {"Authorization": "Bearer " + self.token} if self.token else {}
        hdrs.update(headers or {})
        attempt = 0
        while True:
            conn = self._conn(timeout if timeout is not None else self.timeout)
            try:
                conn.request(method, self._u.path.rstrip("/") + path, body=body, headers=hdrs)
                resp = conn.getresponse()
            except Exception:
                conn.close()
                raise
            if resp.status < 400:
                resp._hiloop_conn = conn  # type: ignore[attr-defined]
                return resp
            err = _read_error(resp)
            conn.close()
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
        resp = self._open(method, path, body, hdrs, timeout)
        try:
            data = resp.read()
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]
        if resp.status == 204 or not data:
            return None
        return json.loads(data)

    def org(self) -> Dict[str, Any]:
        """The caller's organization and its quotas."""
        return self._json("GET", "/v1/org")


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
        path, wait = self._path("/exec/run"), (timeout or 60) + 60
        if self._c.wake:
            path, wait = path + "?wake=true", wait + _WAKE_WAIT
        res = self._c._json("POST", path, req, timeout=wait)
        return CommandResult(res.get("exit_code"), res["stdout"].encode(), res["stderr"].encode(),
                             res["timed_out"], res.get("signal", ""))

    def exec(self, cmd: Command, on_stdout: Optional[Callable[[bytes], None]] = None,
             on_stderr: Optional[Callable[[bytes], None]] = None, timeout: Optional[float] = None,
             stdin: Optional[Union[bytes, BinaryIO]] = None) -> CommandResult:
        """Runs a command over the exec WebSocket, calling on_stdout and
        on_stderr with each chunk as it comes (without them the output is
        collected in the result). A stream that breaks before the exit
        status raises StreamLostError; a command past timeout comes back
        with timed_out."""
        q: Dict[str, str] = {}
        if stdin is not None:
            q["stdin"] = "true"
        if timeout is not None:
            q["timeout"] = "%dms" % int(timeout * 1000)
        handshake = 30.0
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
        out, errs = bytearray(), bytearray()
        try:
            ws.send(_ws.OP_TEXT, json.dumps({"command": _argv(cmd)}).encode())
            if stdin is not None:
                data = stdin if isinstance(stdin, bytes) else None
                reader = io.BytesIO(data) if data is not None else stdin
                while True:
                    chunk = reader.read(32 << 10)  # type: ignore[union-attr]
                    if not chunk:
                        break
                    ws.send(_ws.OP_BINARY, bytes([CHAN_STDIN]) + chunk)
                ws.send(_ws.OP_BINARY, bytes([CHAN_CLOSE_IN, CHAN_STDIN]))
            while True:
                try:
                    op, msg = ws.recv()
                except (_ws.ConnectionClosed, OSError) as e:
                    raise StreamLostError("the exec stream ended without an exit status: %s" % e,
                                          code="stream_lost") from None
                if op != _ws.OP_BINARY or not msg:
                    continue
                ch, payload = msg[0], msg[1:]
                if ch == CHAN_STDOUT:
                    on_stdout(payload) if on_stdout else out.extend(payload)
                elif ch == CHAN_STDERR:
                    on_stderr(payload) if on_stderr else errs.extend(payload)
                elif ch == CHAN_EXIT:
                    f = json.loads(payload)
                    e = f.get("error")
                    if e:
                        if e.get("code") == "exec_timeout":
                            return CommandResult(None, bytes(out), bytes(errs), timed_out=True)
                        raise error_for(_stream_status(e.get("code", "")), e.get("code", ""), e.get("message", ""),
                                        e.get("request_id", ""))
                    if f.get("exit_code") is None:
                        raise StreamLostError("the exit frame carried no exit code", code="stream_lost")
                    return CommandResult(f["exit_code"], bytes(out), bytes(errs), signal=f.get("signal", ""))
        finally:
            ws.close()


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
        stream (Content-Type application/x-tar). Close it."""
        return self._sb._c._open("GET", self._path(path), timeout=None)

    def read(self, path: str) -> bytes:
        """Reads the file at path whole; a transfer that breaks midway
        raises, never returns short."""
        resp = self.open(path)
        try:
            if resp.getheader("Content-Type", "").startswith(TAR_MEDIA_TYPE):
                raise ConflictError("%s is a directory; use download_dir" % path, code="path_conflict", status=409)
            return resp.read()
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
            return n
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]

    def upload_dir(self, local: str, path: str) -> Dict[str, Any]:
        """Copies the local directory into the directory at path (made if
        missing), as a tar stream; the image needs tar."""
        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
                for entry in sorted(os.listdir(local)):
                    tf.add(os.path.join(local, entry), arcname=entry)
            size = f.tell()
            f.seek(0)

            def rewind() -> Any:
                f.seek(0)
                return f
            return self._upload(self._path(path), TAR_MEDIA_TYPE, f, size, rewind)

    def download_dir(self, path: str, local: str) -> None:
        """Copies the directory at path into the local directory (made if
        missing). What the sandbox sends is not trusted: only directories
        and regular files are written, each inside local; links and devices
        are skipped, and an entry naming a path outside is an error."""
        resp = self.open(path)
        try:
            if not resp.getheader("Content-Type", "").startswith(TAR_MEDIA_TYPE):
                raise ConflictError("%s is a file, not a directory" % path, code="path_conflict", status=409)
            os.makedirs(local, exist_ok=True)
            root = os.path.realpath(local)
            with tarfile.open(fileobj=resp, mode="r|") as tf:
                for m in tf:
                    name = os.path.normpath(m.name)
                    if name == ".":
                        continue
                    target = os.path.realpath(os.path.join(root, name))
                    if os.path.isabs(name) or name.startswith("..") or not target.startswith(root + os.sep):
                        raise InvalidRequestError("tar entry %r lands outside %s" % (m.name, local), code="invalid_path")
                    if m.isdir():
                        os.makedirs(target, mode=0o700 | (m.mode & 0o777), exist_ok=True)
                    elif m.isfile():
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        src = tf.extractfile(m)
                        with open(target, "wb") as out:
                            shutil.copyfileobj(src, out)  # type: ignore[arg-type]
                        os.chmod(target, m.mode & 0o777)
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]
