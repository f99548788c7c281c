"""The synchronous client's WebSocket: a socket moving the frames that
_core describes. One connection; binary and text messages; pings answered;
close."""

import socket
import ssl
import threading
import time
from typing import Dict, Optional, Tuple

from . import _core
from ._core import ConnectionClosed, HandshakeError

OP_TEXT, OP_BINARY = _core.OP_TEXT, _core.OP_BINARY

__all__ = ["WebSocket", "ConnectionClosed", "HandshakeError", "OP_TEXT", "OP_BINARY"]


class WebSocket:
    def __init__(self, sock: socket.socket, rest: bytes = b"") -> None:
        self.sock = sock
        self._frames = _core.FrameReader(rest)
        # Sends come from the caller and from recv's pong: one at a time.
        self._send_lock = threading.Lock()
        # deadline (time.monotonic) bounds every read and write that
        # follows, however slowly the peer trickles; None: no bound.
        self.deadline: Optional[float] = None

    def _arm(self) -> None:
        if self.deadline is None:
            self.sock.settimeout(None)
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the connection's deadline passed")
        self.sock.settimeout(left)

    @classmethod
    def connect(cls, url: str, headers: Dict[str, str], subprotocol: str, timeout: float,
                ssl_context: Optional[ssl.SSLContext] = None) -> "WebSocket":
        """Opens the WebSocket at url. The handshake, TLS included, must be
        done within timeout: an answer that trickles in slower ends in
        ConnectionClosed, as does one that is not HTTP."""
        deadline = time.monotonic() + timeout
        u, secure, host, port = _core.ws_target(url)
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            if secure:
                ctx = ssl_context or ssl.create_default_context()
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock = ctx.wrap_socket(sock, server_hostname=host)
            return cls._handshake(sock, deadline, url, headers, subprotocol)
        except HandshakeError:
            sock.close()
            raise
        except ConnectionClosed as e:
            sock.close()
            raise ConnectionClosed("websocket handshake: %s" % e) from None
        except (OSError, ValueError) as e:
            sock.close()
            raise ConnectionClosed("websocket handshake: %s" % (str(e) or type(e).__name__)) from None

    @classmethod
    def _handshake(cls, sock: socket.socket, deadline: float, url: str, headers: Dict[str, str],
                   subprotocol: str) -> "WebSocket":
        request, accept = _core.ws_handshake(_core.ws_target(url)[0], headers, subprotocol)
        ws = cls(sock)
        ws.deadline = deadline
        ws._arm()
        sock.sendall(request)
        buf = b""
        while True:
            head = _core.split_head(buf)
            if head is not None:
                break
            chunk = ws._recv_some(4096)
            if not chunk:
                raise ConnectionClosed("connection closed")
            buf += chunk
        status, resp_headers, rest = head
        if status != 101:
            n = _core.handshake_body_length(resp_headers)
            while len(rest) < n:
                chunk = ws._recv_some(4096)
                if not chunk:
                    break
                rest += chunk
            raise HandshakeError(status, resp_headers, rest[:n])
        if resp_headers.get("sec-websocket-accept") != accept:
            raise ConnectionClosed("wrong Sec-WebSocket-Accept")
        ws._frames.feed(rest)
        ws.deadline = None
        return ws

    def _recv_some(self, n: int) -> bytes:
        self._arm()
        return self.sock.recv(n)

    def send(self, opcode: int, payload: bytes) -> None:
        """Sends one frame, masked as a client must."""
        frame = _core.encode_frame(opcode, payload)
        with self._send_lock:
            self._arm()
            self.sock.sendall(frame)

    def recv(self) -> Tuple[int, bytes]:
        """Returns the next data message (opcode, payload); answers pings;
        raises ConnectionClosed at a close frame or the end of the stream."""
        while True:
            ev = self._frames.next()
            if ev is None:
                chunk = self._recv_some(max(65536, self._frames.want()))
                if not chunk:
                    raise ConnectionClosed("connection closed")
                self._frames.feed(chunk)
                continue
            kind, op, data = ev
            if kind == _core.PING:
                self.send(_core.OP_PONG, data)
            elif kind == _core.CLOSE:
                try:
                    self.send(_core.OP_CLOSE, data[:2])
                except OSError:
                    pass
                raise ConnectionClosed("closed by the server")
            else:
                return op, data

    def close(self) -> None:
        # A sender blocked on a peer that stopped reading holds the lock:
        # the socket is closed under it without a close frame.
        if self._send_lock.acquire(timeout=1.0):
            try:
                self.sock.settimeout(1.0)
                self.sock.sendall(_core.close_frame())
            except OSError:
                pass
            finally:
                self._send_lock.release()
        try:
            # Wakes a recv blocked in another thread, which close alone
            # would not.
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
