"""hiloop's asyncio client: the calls of hiloop.Client as coroutines, on
asyncio streams alone.

    import asyncio
    from hiloop import aio

    async def main() -> None:
        async with aio.Client() as client:      # HILOOP_URL, HILOOP_TOKEN
            async with client.sandboxes.create("hiloop.local/python:3.11", ttl="1h") as sb:
                print((await sb.run(["python3", "-c", "print(6*7)"])).stdout)

    asyncio.run(main())

Requests, answers, refusals, retries and the exec protocol come from the
same module as the synchronous client's (hiloop._core), so the two behave
alike; this module moves their bytes over asyncio streams, reusing
keep-alive connections. A client belongs to the event loop it first ran
in."""

import asyncio
import http.client
import io
import os
import ssl
import tempfile
import time
import uuid
from typing import (IO, Any, AsyncIterator, Awaitable, BinaryIO, Callable, Dict, Generator, List, Mapping,
                    Optional, Sequence, Tuple, TypeVar, Union)

from . import _core, _tar
from ._core import (MAX_ENTRIES, MAX_FILE_BYTES, MAX_OUTPUT, TAR_MEDIA_TYPE, Call, Command, CommandResult,
                    ConnectionClosed, Duration, FileEntry, FileList, HandshakeError, Preview, Process, SandboxInfo,
                    json_call)
from .errors import ConflictError, HiloopError, StreamLostError

__all__ = ["Client", "Sandboxes", "Sandbox", "Files", "Processes", "ProcessOutput", "ExecSession", "Response",
           "CommandResult", "SandboxInfo", "FileEntry", "FileList", "Process", "Previews", "Preview"]

T = TypeVar("T")


class _Opening(Awaitable[T]):
    """What create and open_exec return: await it for the object, or use
    it with `async with`, which closes (or deletes) the object on exit."""

    def __init__(self, coro: Awaitable[T]) -> None:
        self._coro = coro
        self._obj: Any = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._coro.__await__()

    async def __aenter__(self) -> T:
        self._obj = await self._coro
        return self._obj

    async def __aexit__(self, *exc: Any) -> None:
        await self._obj.__aexit__(*exc)


class _Conn:
    """One connection. Every read and write goes through io(), bounded by
    timeout (each) and deadline (all of them together), either None."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.timeout: Optional[float] = None
        self.deadline: Optional[float] = None
        self.expired = False
        self.idle_since = 0.0

    async def io(self, aw: Awaitable[T], what: str = "the server") -> T:
        limit = self.timeout
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            limit = left if limit is None else min(limit, left)
        if limit is None:
            return await aw
        try:
            return await asyncio.wait_for(aw, max(limit, 0.0))
        except asyncio.TimeoutError:
            self.expired = True
            raise TimeoutError("%s: no answer within %gs" % (what, max(limit, 0.0))) from None

    def close(self) -> None:
        self.writer.close()


class _Pool:
    """The client's idle keep-alive connections, as the synchronous
    client's _Pool: at most POOL_SIZE, each reused only while the server
    has not closed it and for POOL_IDLE seconds at most."""

    def __init__(self, client: "Client") -> None:
        self._c = client
        self._idle: List[_Conn] = []

    async def get(self, timeout: float) -> Tuple[_Conn, bool]:
        if self._idle:
            # Lets the loop take a close the server sent meanwhile.
            await asyncio.sleep(0)
        while self._idle:
            conn = self._idle.pop()
            if time.monotonic() - conn.idle_since < _core.POOL_IDLE and not conn.reader.at_eof() \
                    and not conn.writer.is_closing():
                return conn, True
            conn.close()
        return await self._c._connect(timeout), False

    def put(self, conn: _Conn) -> None:
        if len(self._idle) < _core.POOL_SIZE and not conn.writer.is_closing():
            conn.idle_since = time.monotonic()
            conn.timeout = conn.deadline = None
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Stale(Exception):
    """A reused connection the server had closed before answering."""


class Response:
    """An answer whose status is below 400: status, headers (names lower
    case), and its body through read. files.open returns one; close it."""

    def __init__(self, client: "Client", conn: _Conn, status: int, headers: Dict[str, str], method: str) -> None:
        self._c, self._conn = client, conn
        self.status, self.headers = status, headers
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left: Optional[int] = None  # bytes of the body (or chunk) left; None: until the close
        self._closed = False
        self.will_close = headers.get("connection", "").lower() == "close"
        if method == "HEAD" or status in (204, 304) or status < 200:
            self._left = 0
        elif self._chunked:
            self._left = 0
            self._chunk_end = False
        elif "content-length" in headers:
            cl = headers["content-length"]
            if not cl.isdigit():
                raise ConnectionError("the answer's Content-Length %r is not a number" % cl[:40])
            self._left = int(cl)
        else:
            self.will_close = True
        self.done = self._left == 0 and not self._chunked

    def getheader(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    async def read(self, n: int = 1 << 20) -> bytes:
        """Up to n bytes of the body, b"" at its end; IncompleteRead for a
        body cut short of its length."""
        if self.done:
            return b""
        try:
            return await self._read(n)
        except asyncio.IncompleteReadError:
            raise http.client.IncompleteRead(b"") from None
        except asyncio.LimitOverrunError:
            raise ConnectionError("a malformed chunk in the answer") from None

    async def _read(self, n: int) -> bytes:
        r, io_ = self._conn.reader, self._conn.io
        if self._chunked:
            if self._left == 0:
                if self._chunk_end:
                    await io_(r.readexactly(2))
                line = await io_(r.readuntil(b"\r\n"))
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ConnectionError("a malformed chunk in the answer") from None
                if size == 0:
                    while await io_(r.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    self.done = True
                    return b""
                self._left, self._chunk_end = size, True
            data = await io_(r.read(min(n, self._left or 0)))
            if not data:
                raise http.client.IncompleteRead(b"")
            self._left = (self._left or 0) - len(data)
            return data
        if self._left is None:
            data = await io_(r.read(n))
            if not data:
                self.done = True
            return data
        data = await io_(r.read(min(n, self._left)))
        if not data:
            raise http.client.IncompleteRead(b"", self._left)
        self._left -= len(data)
        self.done = self._left == 0
        return data

    async def read_capped(self, cap: int, what: str) -> bytes:
        """The whole body, refused with LimitError past cap bytes."""
        parts: List[bytes] = []
        n = 0
        while True:
            b = await self.read(min(1 << 20, cap + 1 - n))
            if not b:
                return b"".join(parts)
            n += len(b)
            if n > cap:
                raise _core.too_large(what, cap)
            parts.append(b)

    def close(self) -> None:
        """Gives the connection back for reuse when the body was read
        whole in time, else closes it."""
        if self._closed:
            return
        self._closed = True
        if self.done and not self.will_close and not self._conn.expired:
            self._c._pool.put(self._conn)
        else:
            self._conn.close()

    async def __aenter__(self) -> "Response":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


def _header_value(v: str) -> str:
    if "\r" in v or "\n" in v:
        raise ValueError("a header value holds a line break")
    return v


class Client:
    """An asyncio client of the hiloop API at url (HILOOP_URL, else
    hiloop dev's http://127.0.0.1:8080) with the key token (HILOOP_TOKEN),
    as hiloop.Client. It keeps up to a few idle connections open for the
    next calls; close them with `await client.close()` or `async with`."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, timeout: float = 120.0,
                 max_retries: int = 4, ssl_context: Optional[ssl.SSLContext] = None, wake: bool = True) -> None:
        self.wake = wake
        self.url, self._u = _core.parse_url(url)
        self.token: str = token or os.environ.get("HILOOP_TOKEN") or ""
        self.timeout = timeout
        self.max_retries = max_retries
        self.ssl_context = ssl_context
        self._pool = _Pool(self)
        self.sandboxes = Sandboxes(self)

    async def close(self) -> None:
        """Closes the idle connections; the client stays usable."""
        self._pool.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- HTTP -------------------------------------------------------------

    async def _connect(self, timeout: float, url: Optional[str] = None) -> _Conn:
        u, secure, host, port = _core.ws_target(url or self.url)
        ctx = (self.ssl_context or ssl.create_default_context()) if secure else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=ctx, server_hostname=host if ctx else None,
                                        limit=_core.MAX_HEAD), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("connecting to %s: no answer within %gs" % (u.netloc, timeout)) from None
        return _Conn(reader, writer)

    async def _send(self, conn: _Conn, call: Call, body: Any, headers: Mapping[str, str]) -> None:
        lines = ["%s %s HTTP/1.1" % (call.method, self._u.path.rstrip("/") + call.path),
                 "Host: " + self._u.netloc.split("@")[-1]]
        hdrs = dict(headers)
        if isinstance(body, (bytes, bytearray)):
            hdrs["Content-Length"] = str(len(body))
        elif body is None and call.method in ("POST", "PUT", "PATCH"):
            hdrs["Content-Length"] = "0"
        lines += ["%s: %s" % (k, _header_value(v)) for k, v in hdrs.items()]
        conn.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if isinstance(body, (bytes, bytearray)):
            conn.writer.write(body)
        elif body is not None:
            loop = asyncio.get_running_loop()
            while True:
                chunk = await loop.run_in_executor(None, body.read, 1 << 20)
                if not chunk:
                    break
                conn.writer.write(chunk)
                await conn.io(conn.writer.drain(), call.what)
        await conn.io(conn.writer.drain(), call.what)

    async def _head(self, conn: _Conn, call: Call, reused: bool) -> Tuple[int, Dict[str, str]]:
        try:
            head = await conn.io(conn.reader.readuntil(b"\r\n\r\n"), call.what)
        except asyncio.IncompleteReadError as e:
            if reused and not e.partial:
                raise _Stale() from None
            raise ConnectionError("%s: the connection closed before the answer" % call.what) from None
        except asyncio.LimitOverrunError:
            raise ConnectionError("%s: answer head too long" % call.what) from None
        try:
            parsed = _core.split_head(head)
        except ConnectionClosed as e:
            raise ConnectionError("%s: %s" % (call.what, e)) from None
        if parsed is None:
            raise ConnectionError("%s: the answer is not HTTP" % call.what)
        headers = parsed[1]
        if head.startswith(b"HTTP/1.0") and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"
        return parsed[0], headers

    async def _open(self, call: Call, body: Any = None, timeout: Optional[float] = None,
                    rewind: Optional[Callable[[], Any]] = None, deadline: bool = False) -> Response:
        """Sends call and returns the answer of a status below 400, as
        hiloop.Client._open does (the same retries); close it."""
        hdrs = _core.auth_headers(self.token)
        hdrs.update(call.headers)
        if body is None:
            body = call.body
        wait = timeout if timeout is not None else call.timeout if call.timeout is not None else self.timeout
        replay = body is None or isinstance(body, bytes) or rewind is not None
        attempt = 0
        while True:
            conn, reused = await self._pool.get(wait)
            conn.timeout = wait
            conn.deadline = time.monotonic() + wait if deadline else None
            try:
                await self._send(conn, call, body, hdrs)
                status, headers = await self._head(conn, call, reused)
                resp = Response(self, conn, status, headers, call.method)
            except (_Stale, ConnectionError) as e:
                conn.close()
                if reused and replay and call.replayable:
                    if rewind is not None:
                        body = rewind()
                    continue
                if isinstance(e, _Stale):
                    raise ConnectionError("%s: the connection closed before the answer" % call.what) from None
                raise
            except BaseException as e:
                conn.close()
                if conn.expired and deadline:
                    raise _core.timeout_error(call, wait) from None
                raise e
            if status < 400:
                return resp
            body_ = b""
            try:
                while len(body_) < _core.MAX_ERROR_BODY:
                    b = await resp.read(_core.MAX_ERROR_BODY - len(body_))
                    if not b:
                        break
                    body_ += b
            except Exception:
                conn.close()
            err = _core.error_from(status, headers, body_)
            resp.close()
            pause = _core.retry_wait(err, attempt, self.max_retries)
            if pause is None or not replay:
                raise err
            await asyncio.sleep(pause)
            attempt += 1
            if rewind is not None:
                body = rewind()

    async def _call(self, call: Call) -> Any:
        """Sends a JSON call and returns its decoded answer, which must
        arrive whole within the call's timeout."""
        wait = call.timeout if call.timeout is not None else self.timeout
        resp = await self._open(call, deadline=True)
        try:
            data = await resp.read_capped(_core.MAX_ANSWER, "the answer to " + call.what)
        except TimeoutError:
            raise _core.timeout_error(call, wait) from None
        finally:
            resp.close()
        return _core.decode_json(data, resp.status)

    async def _ws_connect(self, url: str, handshake: float) -> "_WebSocket":
        """Opens the exec WebSocket, retrying a refused upgrade that asks
        for it (nothing ran yet)."""
        attempt = 0
        while True:
            try:
                return await _WebSocket.connect(self, url, handshake)
            except HandshakeError as e:
                err = _core.handshake_error(e)
                pause = _core.retry_wait(err, attempt, self.max_retries)
                if pause is None:
                    raise err from None
                await asyncio.sleep(pause)
                attempt += 1
            except (ConnectionClosed, OSError, ValueError) as e:
                raise _core.before_start(e) from None

    async def org(self) -> Dict[str, Any]:
        """The caller's organization and its quotas."""
        return await self._call(json_call("GET", "/v1/org"))  # type: ignore[no-any-return]


class _WebSocket:
    """The exec stream's WebSocket on an asyncio connection, framed by
    _core as the synchronous client's is."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self._frames = _core.FrameReader()
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, client: Client, url: str, timeout: float) -> "_WebSocket":
        """Opens the WebSocket at url; the handshake, TLS included, must be
        done within timeout."""
        deadline = time.monotonic() + timeout
        conn = await client._connect(timeout, url)
        conn.deadline = deadline
        try:
            request, accept = _core.ws_handshake(_core.ws_target(url)[0], _core.auth_headers(client.token),
                                                 _core.EXEC_SUBPROTOCOL)
            conn.writer.write(request)
            await conn.io(conn.writer.drain())
            try:
                head = await conn.io(conn.reader.readuntil(b"\r\n\r\n"))
            except asyncio.IncompleteReadError:
                raise ConnectionClosed("websocket handshake: connection closed") from None
            except asyncio.LimitOverrunError:
                raise ConnectionClosed("websocket handshake: answer head too long") from None
            parsed = _core.split_head(head)
            if parsed is None:
                raise ConnectionClosed("websocket handshake: the answer is not HTTP")
            status, headers, _ = parsed
            if status != 101:
                n = _core.handshake_body_length(headers)
                try:
                    body = await conn.io(conn.reader.readexactly(n))
                except asyncio.IncompleteReadError as e:
                    body = e.partial
                raise HandshakeError(status, headers, body)
            if headers.get("sec-websocket-accept") != accept:
                raise ConnectionClosed("websocket handshake: wrong Sec-WebSocket-Accept")
        except BaseException:
            conn.close()
            raise
        conn.deadline = None
        return cls(conn)

    async def send(self, opcode: int, payload: bytes) -> None:
        frame = _core.encode_frame(opcode, payload)
        async with self._lock:
            self._conn.writer.write(frame)
            await self._conn.io(self._conn.writer.drain())

    async def recv(self) -> Tuple[int, bytes]:
        """The next data message (opcode, payload); pings are answered;
        ConnectionClosed at a close frame or the end of the stream."""
        while True:
            ev = self._frames.next()
            if ev is None:
                chunk = await self._conn.io(self._conn.reader.read(max(65536, self._frames.want())))
                if not chunk:
                    raise ConnectionClosed("connection closed")
                self._frames.feed(chunk)
                continue
            kind, op, data = ev
            if kind == _core.PING:
                await self.send(_core.OP_PONG, data)
            elif kind == _core.CLOSE:
                try:
                    await self.send(_core.OP_CLOSE, data[:2])
                except (OSError, TimeoutError, ConnectionClosed):
                    pass
                raise ConnectionClosed("closed by the server")
            else:
                return op, data

    async def close(self) -> None:
        try:
            self._conn.writer.write(_core.close_frame())
            await asyncio.wait_for(self._conn.writer.drain(), 1.0)
        except (OSError, asyncio.TimeoutError, RuntimeError):
            pass
        self._conn.close()


class Sandboxes:
    """client.sandboxes: create, get and list sandboxes."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, image: str, ttl: Optional[Duration] = None,
               volumes: Optional[Sequence[Mapping[str, str]]] = None, labels: Optional[Mapping[str, str]] = None,
               transports: Optional[Sequence[str]] = None, resources: Optional[Mapping[str, str]] = None,
               shutdown_policy: Optional[str] = None, idle_timeout: Optional[Duration] = None, wait: bool = True,
               wait_timeout: float = 300.0, idempotency_key: Optional[str] = None,
               env: Optional[Mapping[str, str]] = None) -> "_Opening[Sandbox]":
        """Creates a sandbox as hiloop.Client's create does. Await it, or
        use it with `async with`, which deletes the sandbox on exit."""
        call = _core.create_call(image, idempotency_key or uuid.uuid4().hex, ttl, volumes, labels, transports,
                                 resources, shutdown_policy, idle_timeout, env)

        async def create() -> Sandbox:
            sb = Sandbox(self._c, await self._c._call(call))
            if wait:
                await sb.wait("running", timeout=wait_timeout)
            return sb
        return _Opening(create())

    async def get(self, sandbox_id: str) -> "Sandbox":
        return Sandbox(self._c, await self._c._call(json_call("GET", _core.sandbox_path(sandbox_id))))

    async def list(self, state: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                   limit: Optional[int] = None) -> AsyncIterator["Sandbox"]:
        """Iterates (async for) over every sandbox the filters select,
        page by page."""
        after = ""
        while True:
            items, after = _core.list_page(await self._c._call(_core.list_call(state, labels, limit, after)))
            for item in items:
                yield Sandbox(self._c, item)
            if not after:
                return


class Sandbox(_core.SandboxBase):
    """One sandbox, as hiloop.Sandbox, with coroutines for its calls. As an
    async context manager it deletes the sandbox on exit."""

    def __init__(self, client: Client, data: Union[SandboxInfo, Mapping[str, Any]]) -> None:
        super().__init__(data)
        self._c = client
        self.files = Files(self)
        self.processes = Processes(self)
        self.previews = Previews(self)

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.delete()

    async def _json(self, method: str, rest: str = "") -> "Sandbox":
        self._set(await self._c._call(json_call(method, self._path(rest))))
        return self

    async def refresh(self) -> "Sandbox":
        return await self._json("GET")

    async def stop(self) -> "Sandbox":
        return await self._json("POST", "/stop")

    async def start(self) -> "Sandbox":
        return await self._json("POST", "/start")

    async def delete(self) -> "Sandbox":
        return await self._json("DELETE")

    async def touch(self) -> "Sandbox":
        """Counts a use now: the idle clock starts again."""
        return await self._json("POST", "/touch")

    async def update(self, ttl: Optional[Duration] = None, idle_timeout: Optional[Duration] = None) -> "Sandbox":
        """Sets the expiry to now plus ttl and the idle timeout (0 turns
        idle stop off), whichever are given."""
        self._set(await self._c._call(_core.update_call(self.id, ttl, idle_timeout)))
        return self

    async def set_ttl(self, ttl: Duration) -> "Sandbox":
        """Sets the expiry to now plus ttl."""
        return await self.update(ttl=ttl)

    async def events(self) -> List[Dict[str, Any]]:
        return _core.events_items(await self._c._call(json_call("GET", self._path("/events"))))

    async def wait(self, state: str = "running", timeout: float = 300.0) -> "Sandbox":
        """Waits on the long poll until the sandbox is in state, as
        hiloop.Sandbox.wait."""
        deadline = time.monotonic() + timeout
        await self.refresh()
        while True:
            secs = _core.wait_step(self.info, state, deadline - time.monotonic())
            if secs is None:
                return self
            before, asked = self.state, time.monotonic()
            self._set(await self._c._call(_core.wait_call(self.id, before, secs)))
            if self.state == before and time.monotonic() - asked < secs:
                await asyncio.sleep(0.2)

    async def run(self, cmd: Command, timeout: Optional[float] = None,
                  stdin: Optional[Union[str, bytes]] = None, env: Optional[Mapping[str, str]] = None,
                  cwd: Optional[str] = None) -> CommandResult:
        """Runs a one-shot command (POST .../exec/run), as
        hiloop.Sandbox.run."""
        return _core.run_result(await self._c._call(_core.run_call(self.id, cmd, timeout, stdin, self._c.wake, env, cwd)))

    def open_exec(self, cmd: Command, stdin: bool = False, tty: bool = False,
                  size: Optional[Tuple[int, int]] = None, timeout: Optional[float] = None,
                  env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> "_Opening[ExecSession]":
        """Starts a command over the exec WebSocket, as
        hiloop.Sandbox.open_exec. Await it, or use it with `async with`,
        which closes the session on exit."""
        url, handshake = _core.exec_url(self._c.url, self.id, stdin or tty, tty, timeout, self._c.wake)

        async def open_() -> ExecSession:
            ws = await self._c._ws_connect(url, handshake)
            ws._conn.deadline = time.monotonic() + _core.exec_deadline_after(timeout)
            s = ExecSession(ws)
            try:
                await s._send(_core.OP_TEXT, _core.start_message(cmd, env, cwd))
                if size is not None:
                    await s.resize(*size)
            except BaseException:
                await s.close()
                raise
            return s
        return _Opening(open_())

    async def exec(self, cmd: Command, on_stdout: Optional[Callable[[bytes], None]] = None,
                   on_stderr: Optional[Callable[[bytes], None]] = None, timeout: Optional[float] = None,
                   stdin: Optional[Union[bytes, BinaryIO]] = None, max_output: int = MAX_OUTPUT, tty: bool = False,
                   size: Optional[Tuple[int, int]] = None, env: Optional[Mapping[str, str]] = None,
                   cwd: Optional[str] = None) -> CommandResult:
        """Runs a command over the exec WebSocket, as hiloop.Sandbox.exec
        (on_stdout and on_stderr are plain functions)."""
        async with self.open_exec(cmd, stdin=stdin is not None, tty=tty, size=size, timeout=timeout, env=env,
                                  cwd=cwd) as s:
            if stdin is not None:
                reader = io.BytesIO(stdin) if isinstance(stdin, bytes) else stdin
                while True:
                    chunk = reader.read(32 << 10)
                    if not chunk:
                        await s.close_stdin()
                        break
                    await s.write(chunk)
            return await s.wait(on_stdout, on_stderr, max_output)


class ExecSession:
    """A command running over the exec WebSocket (Sandbox.open_exec), as
    hiloop.ExecSession: `async for stream, data in session` reads its
    output, wait() how it ended. write, close_stdin and resize may run in
    another task than the one reading."""

    def __init__(self, ws: _WebSocket) -> None:
        self._ws = ws
        self._exit: Optional[bytes] = None

    async def __aenter__(self) -> "ExecSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[Tuple[str, bytes]]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Tuple[str, bytes]]:
        while True:
            ev = await self.recv()
            if ev is None:
                return
            yield ev

    def _late(self) -> bool:
        d = self._ws._conn.deadline
        return d is not None and time.monotonic() >= d

    async def _send(self, op: int, payload: bytes) -> None:
        try:
            await self._ws.send(op, payload)
        except (ConnectionClosed, OSError, RuntimeError) as e:
            raise _core.lost(e, self._late()) from None

    async def write(self, data: Union[bytes, str]) -> None:
        """Sends data (text as UTF-8) to the command's stdin."""
        await self._send(_core.OP_BINARY, _core.stdin_message(data.encode() if isinstance(data, str) else bytes(data)))

    async def close_stdin(self) -> None:
        """Tells the command its stdin is at its end."""
        await self._send(_core.OP_BINARY, _core.close_stdin_message())

    async def resize(self, width: int, height: int) -> None:
        """Sets the terminal's size (a session with tty only)."""
        await self._send(_core.OP_BINARY, _core.resize_message(width, height))

    async def recv(self) -> Optional[Tuple[str, bytes]]:
        """The next chunk of output, or None once the command ended."""
        while self._exit is None:
            try:
                op, msg = await self._ws.recv()
            except (ConnectionClosed, OSError) as e:
                raise _core.lost(e, self._late()) from None
            if op != _core.OP_BINARY:
                continue
            name, payload = _core.output(msg)
            if name == "exit":
                self._exit = payload
            elif name is not None:
                return name, payload
        return None

    async def wait(self, on_stdout: Optional[Callable[[bytes], None]] = None,
                   on_stderr: Optional[Callable[[bytes], None]] = None, max_output: int = MAX_OUTPUT) -> CommandResult:
        """Reads the rest of the output and returns how the command ended,
        as hiloop.ExecSession.wait."""
        col = _core.Collector(max_output, on_stdout, on_stderr)
        while True:
            ev = await self.recv()
            if ev is None:
                return col.result(self._exit or b"")
            col.add(*ev)

    async def close(self) -> None:
        await self._ws.close()


class _SyncReader:
    """A blocking file object over a Response, for the tar reader to run
    in a worker thread while the event loop moves the bytes."""

    def __init__(self, resp: Response, loop: asyncio.AbstractEventLoop) -> None:
        self._resp, self._loop = resp, loop

    def read(self, n: int = -1) -> bytes:
        return asyncio.run_coroutine_threadsafe(self._resp.read(n if n > 0 else 1 << 20), self._loop).result()


class Files:
    """sb.files: files and directories in and out of the sandbox, as
    hiloop.Files."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _path(self, path: str, **extra: str) -> str:
        return _core.files_path(self._sb.id, path, self._sb._c.wake, **extra)

    async def write(self, path: str, data: Union[bytes, str, BinaryIO], mode: Optional[int] = None) -> Dict[str, Any]:
        """Writes bytes, text (UTF-8) or a binary file object to path,
        atomically; returns the path, size and sha256 the server got."""
        extra = {"mode": "%04o" % mode} if mode is not None else {}
        if isinstance(data, str):
            data = data.encode()
        if isinstance(data, (bytes, bytearray)):
            return await self._upload(self._path(path, **extra), "application/octet-stream", bytes(data),
                                      len(data), None)
        f = data
        start = f.tell()
        f.seek(0, io.SEEK_END)
        size = f.tell() - start
        f.seek(start)

        def rewind() -> Any:
            f.seek(start)
            return f
        return await self._upload(self._path(path, **extra), "application/octet-stream", f, size, rewind)

    async def list(self, path: str) -> FileList:
        """Lists the directory at path, as hiloop.Files.list."""
        return FileList.from_json(await self._sb._c._call(_core.fs_list_call(self._sb.id, path, self._sb._c.wake)))

    async def stat(self, path: str) -> FileEntry:
        """The entry at path as lstat says, as hiloop.Files.stat."""
        return FileEntry.from_json(await self._sb._c._call(_core.fs_stat_call(self._sb.id, path, self._sb._c.wake)))

    async def exists(self, path: str) -> bool:
        """Reports whether anything is at path; only file_not_found is
        False (a sandbox's not_found raises), as hiloop.Files.exists."""
        try:
            await self.stat(path)
        except HiloopError as e:
            return _core.exists_answer(e)
        return True

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file, a link or an empty directory (with recursive,
        anything), as hiloop.Files.remove."""
        await self._sb._c._call(_core.fs_change_call(self._sb.id, "remove", {"path": path, "recursive": recursive},
                                                     self._sb._c.wake))

    async def mkdir(self, path: str) -> FileEntry:
        """Makes the directory and its missing parents, as
        hiloop.Files.mkdir."""
        return FileEntry.from_json(await self._sb._c._call(
            _core.fs_change_call(self._sb.id, "mkdir", {"path": path}, self._sb._c.wake)))

    async def rename(self, src: str, dst: str, overwrite: bool = False) -> FileEntry:
        """Renames src to dst, as hiloop.Files.rename."""
        req = {"from": src, "to": dst, "overwrite": overwrite}
        return FileEntry.from_json(await self._sb._c._call(
            _core.fs_change_call(self._sb.id, "rename", req, self._sb._c.wake)))

    async def _upload(self, path: str, content_type: str, body: Any, size: int,
                      rewind: Optional[Callable[[], Any]]) -> Dict[str, Any]:
        c = self._sb._c
        call = Call("PUT", path, None, {"Content-Type": content_type, "Content-Length": str(size)})
        resp = await c._open(call, body, timeout=c.timeout, rewind=rewind)
        try:
            data = await resp.read_capped(_core.MAX_ANSWER, "the answer to " + call.what)
        finally:
            resp.close()
        return _core.decode_json(data, resp.status)  # type: ignore[no-any-return]

    async def open(self, path: str) -> Response:
        """Opens path for reading: a file's bytes, or a directory's tar
        stream (Content-Type application/x-tar). Close it."""
        c = self._sb._c
        return await c._open(Call("GET", self._path(path)), timeout=c.timeout + (_core.WAKE_WAIT if c.wake else 0))

    async def read(self, path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
        """Reads the file at path whole, into memory, as hiloop.Files.read."""
        resp = await self.open(path)
        try:
            if resp.getheader("Content-Type").startswith(TAR_MEDIA_TYPE):
                raise ConflictError("%s is a directory; use download_dir" % path, code="path_conflict", status=409)
            return await resp.read_capped(max_bytes, "the file %s" % path)
        finally:
            resp.close()

    async def read_to(self, path: str, out: IO[bytes]) -> int:
        """Streams the file at path into out; returns the bytes copied."""
        resp = await self.open(path)
        n = 0
        try:
            while True:
                chunk = await resp.read(1 << 20)
                if not chunk:
                    return n
                out.write(chunk)
                n += len(chunk)
        finally:
            resp.close()

    async def upload_dir(self, local: str, path: str) -> Dict[str, Any]:
        """Copies the local directory into the directory at path, as
        hiloop.Files.upload_dir."""
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryFile() as f:
            size = await loop.run_in_executor(None, _tar.pack, local, f)

            def rewind() -> Any:
                f.seek(0)
                return f
            return await self._upload(self._path(path), TAR_MEDIA_TYPE, f, size, rewind)

    async def download_dir(self, path: str, local: str, overwrite: bool = False, max_bytes: int = MAX_FILE_BYTES,
                           max_entries: int = MAX_ENTRIES) -> None:
        """Copies the directory at path into local, as
        hiloop.Files.download_dir (the same checks, on a worker thread)."""
        dest, exists = _tar.destination(local, overwrite)
        resp = await self.open(path)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, _tar.unpack, _SyncReader(resp, loop), resp.getheader("Content-Type"),
                                       path, local, dest, exists, max_bytes, max_entries)
        finally:
            resp._conn.close()


class Processes:
    """sb.processes: background processes, as hiloop.Processes."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    async def _call(self, call: Call) -> Any:
        return await self._sb._c._call(call)

    async def start(self, cmd: Command, env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None) -> Process:
        """Starts cmd detached, with env added to its environment and in
        the directory cwd when given, and returns it running."""
        return Process.from_json(await self._call(_core.process_start_call(self._sb.id, cmd, self._sb._c.wake,
                                                                           env, cwd)))

    async def list(self) -> List[Process]:
        """The sandbox's processes, newest first."""
        return _core.processes_items(await self._call(json_call("GET", self._sb._path("/processes"))))

    async def get(self, pid: str) -> Process:
        return Process.from_json(await self._call(json_call("GET", _core.process_path(self._sb.id, pid))))

    async def kill(self, pid: str) -> Process:
        """Sends KILL to the process's group."""
        return Process.from_json(await self._call(json_call("DELETE", _core.process_path(self._sb.id, pid))))

    async def signal(self, pid: str, signal: str) -> Process:
        """Sends signal ("TERM", "INT", ...) to the process's group."""
        return Process.from_json(await self._call(_core.signal_call(self._sb.id, pid, signal)))

    async def write_stdin(self, pid: str, data: Union[bytes, str], close: bool = False) -> None:
        """Writes data (at most 64 KiB) to the process's stdin, then, with
        close, closes it. Sent once, never retried."""
        await self._call(_core.stdin_call(self._sb.id, pid, data, close))

    async def close_stdin(self, pid: str) -> None:
        await self.write_stdin(pid, b"", close=True)

    async def output(self, pid: str, offset: int = 0, follow: bool = False) -> "ProcessOutput":
        """Opens the process's output from offset, as
        hiloop.Processes.output. Close it (or use `async with`)."""
        c = self._sb._c
        resp = await c._open(_core.output_call(self._sb.id, pid, offset, follow),
                             timeout=_core.FOLLOW_WAIT if follow else c.timeout)
        return ProcessOutput(resp, _core.output_start(resp.headers, offset))

    async def attach(self, pid: str, on_output: Callable[[bytes], Any], offset: int = 0) -> Process:
        """Follows the output from offset into on_output (a function or a
        coroutine function) until the process ended, attaching again
        after a cut; returns the process, as hiloop.Processes.attach."""
        empty_cuts = 0
        while True:
            start = offset
            try:
                out = await self.output(pid, offset, follow=True)
            except (HiloopError, OSError, http.client.HTTPException) as e:
                if not _core.reattach(e):
                    raise
                cut: BaseException = e
            else:
                async with out:
                    try:
                        async for chunk in out:
                            r = on_output(chunk)
                            if asyncio.iscoroutine(r):
                                await r
                        return await self.get(pid)
                    except StreamLostError as e:
                        offset, cut = out.offset, e
            empty_cuts = empty_cuts + 1 if offset == start else 0
            p = await self.get(pid)
            if _core.attach_over(p, cut, empty_cuts):
                return p
            await asyncio.sleep(_core.REATTACH_PAUSE)

    async def wait(self, pid: str) -> Process:
        """Waits until the process exited or ended, and returns it."""
        p = await self.get(pid)
        if not p.running:
            return p
        return await self.attach(pid, lambda _: None, p.output_bytes or 0)


class ProcessOutput:
    """A process's output as it comes, as hiloop.ProcessOutput: `async
    for` its chunks, or read(n); offset is where to attach again."""

    def __init__(self, resp: Response, offset: int) -> None:
        self._resp = resp
        self.offset = offset

    async def __aenter__(self) -> "ProcessOutput":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[bytes]:
        while True:
            b = await self.read()
            if not b:
                return
            yield b

    async def read(self, n: int = 1 << 16) -> bytes:
        """Up to n bytes as they come; b"" at the end."""
        try:
            b = await self._resp.read(n)
        except (OSError, http.client.HTTPException, asyncio.TimeoutError) as e:
            self._resp.close()
            raise StreamLostError("the process output was cut at offset %d: %s" % (self.offset, e),
                                  code="stream_lost") from None
        self.offset += len(b)
        return b

    def close(self) -> None:
        """Ends the reading."""
        self._resp.close()


class Previews:
    """sb.previews: URLs that serve the sandbox's ports (docs/api.md
    "Previews"). The deployment needs serve --preview-domain (else
    NotFoundError, previews_disabled) and the sandbox the forward
    transport."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    async def create(self, port: int, auth: str = "token", ttl: Optional[Duration] = None) -> Preview:
        """Serves port (on the sandbox's loopback) at preview.url: with
        auth "token" (the default) the URL carries a fresh token, shown
        in this answer only; with "key" a visitor sends an API key of the
        organization. ttl ("2h", seconds, a timedelta) is 24h when None.
        Sent once, never retried."""
        return Preview.from_json(await self._sb._c._call(_core.preview_create_call(self._sb.id, port, auth, ttl)))

    async def list(self) -> List[Preview]:
        """The live previews, oldest first, their URLs without tokens."""
        return _core.previews_items(await self._sb._c._call(json_call("GET", self._sb._path("/previews"))))

    async def revoke(self, preview_id: str) -> None:
        """Revokes the preview: its URL stops working at once, and what
        is open through it is closed."""
        await self._sb._c._call(json_call("DELETE", _core.preview_path(self._sb.id, preview_id)))
