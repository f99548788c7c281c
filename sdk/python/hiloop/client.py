"""hiloop's Python client: sandboxes, commands and files, over the HTTP API
and the exec WebSocket, with the standard library alone. Requests, answers,
refusals and the exec protocol come from _core, which hiloop.aio shares;
this module moves their bytes over blocking sockets, reusing keep-alive
connections."""

import http.client
import io
import os
import select
import socket
import ssl
import tempfile
import threading
import time
import uuid
from typing import (IO, Any, BinaryIO, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

from . import _core, _tar, _ws
from ._core import (MAX_ENTRIES, MAX_FILE_BYTES, MAX_OUTPUT, TAR_MEDIA_TYPE, Call, Command, CommandResult,
                    Duration, FileEntry, FileList, Preview, Process, SandboxInfo, json_call)
from .errors import ConflictError, HiloopError, StreamLostError

__all__ = ["Client", "Sandboxes", "Sandbox", "Files", "Processes", "ProcessOutput", "ExecSession", "CommandResult",
           "SandboxInfo", "FileEntry", "FileList", "Process", "Previews", "Preview", "MAX_FILE_BYTES", "MAX_ENTRIES", "MAX_OUTPUT"]


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


class _Pool:
    """The client's idle keep-alive connections, at most POOL_SIZE, each
    reused only while the server has not closed it (nothing readable on
    an idle connection) and for POOL_IDLE seconds at most. Safe across
    threads: a connection serves one request at a time."""

    def __init__(self, make: Callable[[float], http.client.HTTPConnection]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []

    def get(self, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        """A connection and whether it served a request before."""
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if time.monotonic() - since < _core.POOL_IDLE and _alive(conn):
                conn.timeout = timeout
                conn.sock.settimeout(timeout)
                return conn, True
            conn.close()
        return self._make(timeout), False

    def put(self, conn: http.client.HTTPConnection) -> None:
        if conn.sock is None:
            return
        with self._lock:
            if len(self._idle) < _core.POOL_SIZE:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


def _alive(conn: http.client.HTTPConnection) -> bool:
    """Reports whether an idle connection is still open: the server sends
    nothing on one, so anything readable is its close (or garbage)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


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
            raise _core.too_large(what, cap)
        parts.append(b)


class Client:
    """A client of the hiloop API at url (HILOOP_URL, else hiloop dev's
    http://127.0.0.1:8080) with the key token (HILOOP_TOKEN). It keeps up
    to a few idle connections open for the next calls, from any thread;
    close() (or leaving `with`) closes them."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, timeout: float = 120.0,
                 max_retries: int = 4, ssl_context: Optional[ssl.SSLContext] = None, wake: bool = True) -> None:
        # wake: run, exec and the file calls start a sandbox stopped for
        # idleness and wait for it (?wake=true, up to the server's wake
        # timeout); with wake=False such a sandbox raises ConflictError
        # (sandbox_not_running). A sandbox its owner stopped is never woken.
        self.wake = wake
        self.url, self._u = _core.parse_url(url)
        self.token: str = token or os.environ.get("HILOOP_TOKEN") or ""
        self.timeout = timeout
        self.max_retries = max_retries
        self.ssl_context = ssl_context
        self._pool = _Pool(self._conn)
        self.sandboxes = Sandboxes(self)

    def close(self) -> None:
        """Closes the idle connections; the client stays usable."""
        self._pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- HTTP -------------------------------------------------------------

    def _conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._u.scheme == "https":
            return http.client.HTTPSConnection(self._u.hostname or "", self._u.port, timeout=timeout,
                                               context=self.ssl_context, blocksize=1 << 20)
        return http.client.HTTPConnection(self._u.hostname or "", self._u.port, timeout=timeout, blocksize=1 << 20)

    def _open(self, call: Call, body: Any = None, timeout: Optional[float] = None,
              rewind: Optional[Callable[[], Any]] = None, deadline: bool = False) -> http.client.HTTPResponse:
        """Sends call (with body, a file object, in place of its bytes)
        and returns the response of a status below 400; give it back with
        _release. An error status raises its HiloopError. A 429 or 503
        with Retry-After is retried after the wait it asks, unless the
        body cannot be sent again; so is a request of call.replayable
        whose reused connection the server had closed. timeout bounds each
        read and write (the call's, else the client's, when None); with
        deadline it bounds the whole exchange as well, the answer's body
        included, and a call past it raises TimeoutError."""
        hdrs = _core.auth_headers(self.token)
        hdrs.update(call.headers)
        if body is None:
            body = call.body
        wait = timeout if timeout is not None else call.timeout if call.timeout is not None else self.timeout
        replay = body is None or isinstance(body, bytes) or rewind is not None
        attempt = 0
        while True:
            conn, reused = self._pool.get(wait)
            dl = _Deadline(conn, wait) if deadline else None
            try:
                conn.request(call.method, self._u.path.rstrip("/") + call.path, body=body, headers=hdrs)
                if dl is not None and dl.fired:
                    raise TimeoutError()
                resp = conn.getresponse()
            except ConnectionError as e:
                conn.close()
                if dl is not None:
                    dl.cancel()
                    _raise_if_late(dl, e, call, wait)
                if reused and replay and call.replayable:
                    if rewind is not None:
                        body = rewind()
                    continue
                raise
            except Exception as e:
                conn.close()
                if dl is not None:
                    dl.cancel()
                    _raise_if_late(dl, e, call, wait)
                raise
            if resp.status < 400:
                resp._hiloop_conn = conn  # type: ignore[attr-defined]
                resp._hiloop_deadline = dl  # type: ignore[attr-defined]
                return resp
            try:
                err = _core.error_from(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                       resp.read(_core.MAX_ERROR_BODY))
            except Exception as e:
                conn.close()
                if dl is not None:
                    dl.cancel()
                    _raise_if_late(dl, e, call, wait)
                raise
            if dl is not None:
                dl.cancel()
            self._release(resp, conn)
            pause = _core.retry_wait(err, attempt, self.max_retries)
            if pause is None or not replay:
                raise err
            time.sleep(pause)
            attempt += 1
            if rewind is not None:
                body = rewind()

    def _release(self, resp: http.client.HTTPResponse, conn: Optional[http.client.HTTPConnection] = None) -> None:
        """Gives resp's connection back to the pool when its answer was
        read whole within its deadline, else closes it."""
        conn = conn or resp._hiloop_conn  # type: ignore[attr-defined]
        dl: Optional[_Deadline] = getattr(resp, "_hiloop_deadline", None)
        if dl is not None:
            dl.cancel()
        if resp.isclosed() and not (dl is not None and dl.fired) and not resp.will_close:
            self._pool.put(conn)
        else:
            conn.close()

    def _call(self, call: Call) -> Any:
        """Sends a JSON call and returns its decoded answer, which must
        arrive whole within the call's timeout."""
        wait = call.timeout if call.timeout is not None else self.timeout
        resp = self._open(call, deadline=True)
        dl: _Deadline = resp._hiloop_deadline  # type: ignore[attr-defined]
        try:
            data = _read_capped(resp, _core.MAX_ANSWER, "the answer to " + call.what)
        except Exception as e:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]
            dl.cancel()
            _raise_if_late(dl, e, call, wait)
            raise
        self._release(resp)
        return _core.decode_json(data, resp.status)

    def _ws_connect(self, url: str, handshake: float) -> _ws.WebSocket:
        """Opens the exec WebSocket, retrying a refused upgrade that asks
        for it (nothing ran yet)."""
        attempt = 0
        while True:
            try:
                return _ws.WebSocket.connect(url, _core.auth_headers(self.token), _core.EXEC_SUBPROTOCOL,
                                             timeout=handshake, ssl_context=self.ssl_context)
            except _ws.HandshakeError as e:
                err = _core.handshake_error(e)
                pause = _core.retry_wait(err, attempt, self.max_retries)
                if pause is None:
                    raise err from None
                time.sleep(pause)
                attempt += 1
            except _ws.ConnectionClosed as e:
                raise _core.before_start(e) from None

    def org(self) -> Dict[str, Any]:
        """The caller's organization and its quotas."""
        org: Dict[str, Any] = self._call(json_call("GET", "/v1/org"))
        return org


def _raise_if_late(dl: _Deadline, e: BaseException, call: Call, wait: float) -> None:
    """Raises TimeoutError for e when the deadline dl cut the call."""
    if dl.fired and isinstance(e, (OSError, http.client.HTTPException)):
        raise _core.timeout_error(call, wait) from None


class Sandboxes:
    """client.sandboxes: create, get and list sandboxes."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, image: str, ttl: Optional[Duration] = None,
               volumes: Optional[Sequence[Mapping[str, str]]] = None, labels: Optional[Mapping[str, str]] = None,
               transports: Optional[Sequence[str]] = None, resources: Optional[Mapping[str, str]] = None,
               shutdown_policy: Optional[str] = None, idle_timeout: Optional[Duration] = None, wait: bool = True,
               wait_timeout: float = 300.0, idempotency_key: Optional[str] = None,
               env: Optional[Mapping[str, str]] = None) -> "Sandbox":
        """Creates a sandbox and, with wait, waits until it runs. Every try
        of the call carries one Idempotency-Key, so retries make one
        sandbox. ttl and idle_timeout are durations: "1h", seconds, or a
        timedelta."""
        call = _core.create_call(image, idempotency_key or uuid.uuid4().hex, ttl, volumes, labels, transports,
                                 resources, shutdown_policy, idle_timeout, env)
        sb = Sandbox(self._c, self._c._call(call))
        if wait:
            sb.wait("running", timeout=wait_timeout)
        return sb

    def get(self, sandbox_id: str) -> "Sandbox":
        return Sandbox(self._c, self._c._call(json_call("GET", _core.sandbox_path(sandbox_id))))

    def list(self, state: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
             limit: Optional[int] = None) -> Iterator["Sandbox"]:
        """Iterates over every sandbox the filters select, page by page."""
        after = ""
        while True:
            items, after = _core.list_page(self._c._call(_core.list_call(state, labels, limit, after)))
            for item in items:
                yield Sandbox(self._c, item)
            if not after:
                return


class Sandbox(_core.SandboxBase):
    """One sandbox: its id, and info, the last answer about it (a
    SandboxInfo; sb.data is the same). As a context manager it deletes the
    sandbox on exit."""

    def __init__(self, client: Client, data: Union[SandboxInfo, Mapping[str, Any]]) -> None:
        super().__init__(data)
        self._c = client
        self.files = Files(self)
        self.processes = Processes(self)
        self.previews = Previews(self)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete()

    def _json(self, method: str, rest: str = "") -> "Sandbox":
        self._set(self._c._call(json_call(method, self._path(rest))))
        return self

    def refresh(self) -> "Sandbox":
        return self._json("GET")

    def stop(self) -> "Sandbox":
        return self._json("POST", "/stop")

    def start(self) -> "Sandbox":
        return self._json("POST", "/start")

    def delete(self) -> "Sandbox":
        return self._json("DELETE")

    def touch(self) -> "Sandbox":
        """Counts a use now: the idle clock starts again."""
        return self._json("POST", "/touch")

    def update(self, ttl: Optional[Duration] = None, idle_timeout: Optional[Duration] = None) -> "Sandbox":
        """Sets the expiry to now plus ttl (extending or shortening the
        sandbox's life) and the idle timeout (0 turns idle stop off),
        whichever are given. Durations are "4h", seconds or a timedelta."""
        self._set(self._c._call(_core.update_call(self.id, ttl, idle_timeout)))
        return self

    def set_ttl(self, ttl: Duration) -> "Sandbox":
        """Sets the expiry to now plus ttl."""
        return self.update(ttl=ttl)

    def events(self) -> List[Dict[str, Any]]:
        return _core.events_items(self._c._call(json_call("GET", self._path("/events"))))

    def wait(self, state: str = "running", timeout: float = 300.0) -> "Sandbox":
        """Waits on the long poll until the sandbox is in state; WaitError
        when it reaches a state that will not lead there, TimeoutError
        past timeout."""
        deadline = time.monotonic() + timeout
        self.refresh()
        while True:
            secs = _core.wait_step(self.info, state, deadline - time.monotonic())
            if secs is None:
                return self
            before, asked = self.state, time.monotonic()
            self._set(self._c._call(_core.wait_call(self.id, before, secs)))
            if self.state == before and time.monotonic() - asked < secs:
                time.sleep(0.2)

    def run(self, cmd: Command, timeout: Optional[float] = None,
            stdin: Optional[Union[str, bytes]] = None, env: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None) -> CommandResult:
        """Runs a one-shot command (POST .../exec/run): each of stdout and
        stderr holds up to 1 MiB, as bytes, exactly as the command wrote
        them (the answer's base64 decoded). A command past timeout
        (seconds) comes back with timed_out, not an exception. env adds
        variables to its environment and cwd is the absolute directory it
        runs in, both as given (no shell reads them); a cwd the sandbox
        lacks raises NotFoundError (file_not_found, field cwd) and nothing
        ran."""
        return _core.run_result(self._c._call(_core.run_call(self.id, cmd, timeout, stdin, self._c.wake, env, cwd)))

    def open_exec(self, cmd: Command, stdin: bool = False, tty: bool = False,
                  size: Optional[Tuple[int, int]] = None, timeout: Optional[float] = None,
                  env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> "ExecSession":
        """Starts a command over the exec WebSocket and returns its live
        session: write to its stdin (stdin=True), resize its terminal
        (tty=True, which implies stdin; size is the first (width,
        height)), read its output as it comes, then its exit status. Close
        it (or leave `with`). env and cwd are run's, sent in the first
        message, never the URL."""
        url, handshake = _core.exec_url(self._c.url, self.id, stdin or tty, tty, timeout, self._c.wake)
        ws = self._c._ws_connect(url, handshake)
        ws.deadline = time.monotonic() + _core.exec_deadline_after(timeout)
        s = ExecSession(ws)
        try:
            s._send(_ws.OP_TEXT, _core.start_message(cmd, env, cwd))
            if size is not None:
                s.resize(*size)
        except BaseException:
            s.close()
            raise
        return s

    def exec(self, cmd: Command, on_stdout: Optional[Callable[[bytes], None]] = None,
             on_stderr: Optional[Callable[[bytes], None]] = None, timeout: Optional[float] = None,
             stdin: Optional[Union[bytes, BinaryIO]] = None, max_output: int = MAX_OUTPUT, tty: bool = False,
             size: Optional[Tuple[int, int]] = None, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[str] = None) -> CommandResult:
        """Runs a command over the exec WebSocket, calling on_stdout and
        on_stderr with each chunk as it comes (without them the output is
        collected in the result, up to max_output bytes each: past that,
        LimitError with code output_limit). A stream that breaks before the
        exit status raises StreamLostError, as does a server that sends no
        exit status within timeout (the server's 24h without one) and a
        minute; a command past timeout comes back with timed_out. With
        tty, the command runs in a terminal of size (width, height), its
        output all on stdout; stdin, if given, is typed into it."""
        with self.open_exec(cmd, stdin=stdin is not None, tty=tty, size=size, timeout=timeout, env=env,
                            cwd=cwd) as s:
            if stdin is not None:
                reader = io.BytesIO(stdin) if isinstance(stdin, bytes) else stdin
                while True:
                    chunk = reader.read(32 << 10)
                    if not chunk:
                        s.close_stdin()
                        break
                    s.write(chunk)
            return s.wait(on_stdout, on_stderr, max_output)


class ExecSession:
    """A command running over the exec WebSocket (Sandbox.open_exec).
    recv() returns its output as it comes, as ("stdout" or "stderr",
    bytes), and None once the command ended; iterating does the same.
    wait() reads the rest and returns how it ended. write, close_stdin and
    resize may be called from another thread than the one reading."""

    def __init__(self, ws: _ws.WebSocket) -> None:
        self._ws = ws
        self._exit: Optional[bytes] = None

    def __enter__(self) -> "ExecSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[Tuple[str, bytes]]:
        while True:
            ev = self.recv()
            if ev is None:
                return
            yield ev

    def _send(self, op: int, payload: bytes) -> None:
        try:
            self._ws.send(op, payload)
        except (_ws.ConnectionClosed, OSError) as e:
            raise _core.lost(e, self._late()) from None

    def _late(self) -> bool:
        return self._ws.deadline is not None and time.monotonic() >= self._ws.deadline

    def write(self, data: Union[bytes, str]) -> None:
        """Sends data (text as UTF-8) to the command's stdin."""
        self._send(_ws.OP_BINARY, _core.stdin_message(data.encode() if isinstance(data, str) else bytes(data)))

    def close_stdin(self) -> None:
        """Tells the command its stdin is at its end."""
        self._send(_ws.OP_BINARY, _core.close_stdin_message())

    def resize(self, width: int, height: int) -> None:
        """Sets the terminal's size (a session with tty only)."""
        self._send(_ws.OP_BINARY, _core.resize_message(width, height))

    def recv(self) -> Optional[Tuple[str, bytes]]:
        """The next chunk of output, or None once the command ended
        (wait() then tells how). StreamLostError when the stream breaks
        before the exit status."""
        while self._exit is None:
            try:
                op, msg = self._ws.recv()
            except (_ws.ConnectionClosed, OSError) as e:
                raise _core.lost(e, self._late()) from None
            if op != _ws.OP_BINARY:
                continue
            name, payload = _core.output(msg)
            if name == "exit":
                self._exit = payload
            elif name is not None:
                return name, payload
        return None

    def wait(self, on_stdout: Optional[Callable[[bytes], None]] = None,
             on_stderr: Optional[Callable[[bytes], None]] = None, max_output: int = MAX_OUTPUT) -> CommandResult:
        """Reads the rest of the output (collected up to max_output bytes
        of each stream, or handed to on_stdout and on_stderr) and returns
        how the command ended; a command past its timeout comes back with
        timed_out, an error the stream ended with raises."""
        col = _core.Collector(max_output, on_stdout, on_stderr)
        while True:
            ev = self.recv()
            if ev is None:
                return col.result(self._exit or b"")
            col.add(*ev)

    def close(self) -> None:
        """Closes the stream; a command still running is ended when it
        next writes (or, with a tty, at once)."""
        self._ws.close()


class Files:
    """sb.files: files and directories in and out of the sandbox, through
    the exec path, as the image's own user."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _path(self, path: str, **extra: str) -> str:
        return _core.files_path(self._sb.id, path, self._sb._c.wake, **extra)

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

    def list(self, path: str) -> FileList:
        """Lists the directory at path (or the one a link there points
        to): its entries sorted by name, without . and ..; at most 10,000
        of them, with truncated set past that. NotFoundError
        (file_not_found) when nothing is there, ConflictError
        (path_conflict) for a path that is not a directory."""
        return FileList.from_json(self._sb._c._call(_core.fs_list_call(self._sb.id, path, self._sb._c.wake)))

    def stat(self, path: str) -> FileEntry:
        """The entry at path as lstat says (a link is itself);
        NotFoundError (file_not_found) when nothing is there."""
        return FileEntry.from_json(self._sb._c._call(_core.fs_stat_call(self._sb.id, path, self._sb._c.wake)))

    def exists(self, path: str) -> bool:
        """Reports whether anything (a dangling link included) is at path.
        Only file_not_found is False: a sandbox that is not found (or not
        yours) raises NotFoundError (not_found), as any other refusal."""
        try:
            self.stat(path)
        except HiloopError as e:
            return _core.exists_answer(e)
        return True

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file, a link or an empty directory; with recursive, a
        directory and everything in it. ConflictError
        (directory_not_empty) for a directory that holds anything
        without recursive, NotFoundError (file_not_found) for nothing
        there."""
        self._sb._c._call(_core.fs_change_call(self._sb.id, "remove", {"path": path, "recursive": recursive},
                                               self._sb._c.wake))

    def mkdir(self, path: str) -> FileEntry:
        """Makes the directory and its missing parents (one that exists is
        no error) and returns its entry."""
        return FileEntry.from_json(self._sb._c._call(_core.fs_change_call(self._sb.id, "mkdir", {"path": path},
                                                                          self._sb._c.wake)))

    def rename(self, src: str, dst: str, overwrite: bool = False) -> FileEntry:
        """Renames src to dst (making dst's missing parents) and returns
        dst's entry. A dst that exists is ConflictError (path_conflict)
        unless overwrite, which replaces a file, a link or an empty
        directory."""
        req = {"from": src, "to": dst, "overwrite": overwrite}
        return FileEntry.from_json(self._sb._c._call(_core.fs_change_call(self._sb.id, "rename", req,
                                                                          self._sb._c.wake)))

    def _upload(self, path: str, content_type: str, body: Any, size: int,
                rewind: Optional[Callable[[], Any]]) -> Dict[str, Any]:
        c = self._sb._c
        call = Call("PUT", path, None, {"Content-Type": content_type, "Content-Length": str(size)})
        resp = c._open(call, body, timeout=c.timeout, rewind=rewind)
        try:
            data = _read_capped(resp, _core.MAX_ANSWER, "the answer to " + call.what)
        except BaseException:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]
            raise
        c._release(resp)
        info: Dict[str, Any] = _core.decode_json(data, resp.status)
        return info

    def open(self, path: str) -> http.client.HTTPResponse:
        """Opens path for reading: a file's bytes, or a directory's tar
        stream (Content-Type application/x-tar). Close it. A server
        silent for the client's timeout (plus a wake's, when it may wake
        the sandbox) ends the read with TimeoutError."""
        c = self._sb._c
        return c._open(Call("GET", self._path(path)), timeout=c.timeout + (_core.WAKE_WAIT if c.wake else 0))

    def read(self, path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
        """Reads the file at path whole, into memory; a transfer that
        breaks midway raises, never returns short. A file larger than
        max_bytes raises LimitError (output_limit): read_to streams one."""
        resp = self.open(path)
        try:
            if resp.getheader("Content-Type", "").startswith(TAR_MEDIA_TYPE):
                raise ConflictError("%s is a directory; use download_dir" % path, code="path_conflict", status=409)
            data = _read_capped(resp, max_bytes, "the file %s" % path)
        except BaseException:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]
            raise
        self._sb._c._release(resp)
        return data

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
        except BaseException:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]
            raise
        self._sb._c._release(resp)
        return n

    def upload_dir(self, local: str, path: str) -> Dict[str, Any]:
        """Copies the local directory into the directory at path (made if
        missing), as a tar stream; the image needs tar. The tar names no
        owner (uid and gid 0, no user or group names), so nothing of the
        local accounts reaches the sandbox, and tar there makes the files
        the image's user's."""
        with tempfile.TemporaryFile() as f:
            size = _tar.pack(local, f)

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
        dest, exists = _tar.destination(local, overwrite)
        resp = self.open(path)
        try:
            _tar.unpack(resp, resp.getheader("Content-Type", "") or "", path, local, dest, exists,
                        max_bytes, max_entries)
        finally:
            resp._hiloop_conn.close()  # type: ignore[attr-defined]


class Processes:
    """sb.processes: commands started detached in the sandbox, reached by
    their id (docs/api.md "Background processes")."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _call(self, call: Call) -> Any:
        return self._sb._c._call(call)

    def start(self, cmd: Command, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> Process:
        """Starts cmd (a string runs through sh -c) detached and returns
        it running; it outlives this call. Its stdout and stderr are one
        output. env is added to its environment and cwd is the absolute
        directory it starts in, exactly as given; a cwd the sandbox lacks
        raises NotFoundError (code file_not_found). Wakes a sandbox stopped for idleness, as run
        does."""
        return Process.from_json(self._call(_core.process_start_call(self._sb.id, cmd, self._sb._c.wake, env, cwd)))

    def list(self) -> List[Process]:
        """The sandbox's processes, newest first."""
        return _core.processes_items(self._call(json_call("GET", self._sb._path("/processes"))))

    def get(self, pid: str) -> Process:
        """One process, its state as the sandbox tells it now."""
        return Process.from_json(self._call(json_call("GET", _core.process_path(self._sb.id, pid))))

    def kill(self, pid: str) -> Process:
        """Sends KILL to the process's group; returns it as it stood then
        (wait tells its end)."""
        return Process.from_json(self._call(json_call("DELETE", _core.process_path(self._sb.id, pid))))

    def signal(self, pid: str, signal: str) -> Process:
        """Sends signal ("TERM", "INT", "HUP", ... or "SIGTERM") to the
        process's group."""
        return Process.from_json(self._call(_core.signal_call(self._sb.id, pid, signal)))

    def write_stdin(self, pid: str, data: Union[bytes, str], close: bool = False) -> None:
        """Writes data (at most 64 KiB; text as UTF-8) to the process's
        stdin, then, with close, closes it. Sent once, never retried."""
        self._call(_core.stdin_call(self._sb.id, pid, data, close))

    def close_stdin(self, pid: str) -> None:
        """Closes the process's stdin: it reads end of file."""
        self.write_stdin(pid, b"", close=True)

    def output(self, pid: str, offset: int = 0, follow: bool = False) -> "ProcessOutput":
        """Opens the process's output (stdout and stderr together) from
        offset: what is there now, or with follow, on as it comes until
        the process ended. HiloopError (output_gone, status 410) for an
        offset older than what the sandbox keeps. Close it."""
        c = self._sb._c
        resp = c._open(_core.output_call(self._sb.id, pid, offset, follow),
                       timeout=_core.FOLLOW_WAIT if follow else c.timeout)
        return ProcessOutput(c, resp, _core.output_start({k.lower(): v for k, v in resp.getheaders()}, offset))

    def attach(self, pid: str, on_output: Callable[[bytes], None], offset: int = 0) -> Process:
        """Follows the process's output from offset, handing each chunk to
        on_output, until the process ended; returns it then (exited with
        its exit code, or ended). A cut stream is attached again from the
        next offset, so on_output sees every byte once. An offset older
        than what is kept raises (output_gone) while the process runs, as
        does the sixth cut in a row that read nothing (StreamLostError)."""
        empty_cuts = 0
        while True:
            start = offset
            try:
                out = self.output(pid, offset, follow=True)
            except (HiloopError, OSError, http.client.HTTPException) as e:
                if not _core.reattach(e):
                    raise
                cut: BaseException = e
            else:
                with out:
                    try:
                        for chunk in out:
                            on_output(chunk)
                        return self.get(pid)
                    except StreamLostError as e:
                        offset, cut = out.offset, e
            empty_cuts = empty_cuts + 1 if offset == start else 0
            p = self.get(pid)
            if _core.attach_over(p, cut, empty_cuts):
                return p
            time.sleep(_core.REATTACH_PAUSE)

    def wait(self, pid: str) -> Process:
        """Waits until the process exited (exit_code set) or ended, and
        returns it. It follows the output from where it stands without
        keeping it."""
        p = self.get(pid)
        if not p.running:
            return p
        return self.attach(pid, lambda _: None, p.output_bytes or 0)


class ProcessOutput:
    """A process's output as it comes (Processes.output): iterate for its
    chunks of bytes, or read(n). offset is where the next byte sits: where
    to attach again after a cut. The end of a follow means the process
    ended; a cut raises StreamLostError (stream_lost)."""

    def __init__(self, client: Client, resp: http.client.HTTPResponse, offset: int) -> None:
        self._c, self._resp = client, resp
        self.offset = offset
        self._done = False

    def __enter__(self) -> "ProcessOutput":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            b = self.read()
            if not b:
                return
            yield b

    def read(self, n: int = 1 << 16) -> bytes:
        """Up to n bytes as they come; b"" at the end."""
        if self._done:
            return b""
        try:
            b = self._resp.read1(n)
            if not b:
                _check_whole(self._resp)
                self._done = True
        except (OSError, http.client.HTTPException) as e:
            self._resp._hiloop_conn.close()  # type: ignore[attr-defined]
            self._done = True
            raise StreamLostError("the process output was cut at offset %d: %s" % (self.offset, e),
                                  code="stream_lost") from None
        self.offset += len(b)
        return b

    def close(self) -> None:
        """Ends the reading."""
        if self._done and self._resp.isclosed():
            self._c._release(self._resp)
        else:
            self._resp._hiloop_conn.close()  # type: ignore[attr-defined]
        self._done = True


class Previews:
    """sb.previews: URLs that serve the sandbox's ports (docs/api.md
    "Previews"). The deployment needs serve --preview-domain (else
    NotFoundError, previews_disabled) and the sandbox the forward
    transport."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def create(self, port: int, auth: str = "token", ttl: Optional[Duration] = None) -> Preview:
        """Serves port (on the sandbox's loopback) at preview.url: with
        auth "token" (the default) the URL carries a fresh token, shown
        in this answer only; with "key" a visitor sends an API key of the
        organization. ttl ("2h", seconds, a timedelta) is 24h when None.
        Sent once, never retried."""
        return Preview.from_json(self._sb._c._call(_core.preview_create_call(self._sb.id, port, auth, ttl)))

    def list(self) -> List[Preview]:
        """The live previews, oldest first, their URLs without tokens."""
        return _core.previews_items(self._sb._c._call(json_call("GET", self._sb._path("/previews"))))

    def revoke(self, preview_id: str) -> None:
        """Revokes the preview: its URL stops working at once, and what
        is open through it is closed."""
        self._sb._c._call(json_call("DELETE", _core.preview_path(self._sb.id, preview_id)))
