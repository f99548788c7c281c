"""A minimal RFC 6455 WebSocket client, enough for hiloop's exec stream:
one connection, binary and text messages, ping answered, close."""

import base64
import hashlib
import os
import socket
import ssl
import struct
import time
from typing import Dict, Optional, Tuple
from urllib.parse import SplitResult, urlsplit

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
    """The connection ended."""


class WebSocket:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""
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
        u = urlsplit(url)
        secure = u.scheme in ("https", "wss")
        host = u.hostname or "localhost"
        port = u.port or (443 if secure else 80)
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            if secure:
                ctx = ssl_context or ssl.create_default_context()
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock = ctx.wrap_socket(sock, server_hostname=host)
            return cls._handshake(sock, deadline, u, headers, subprotocol)
        except HandshakeError:
            raise
        except ConnectionClosed:
            sock.close()
            raise
        except (OSError, ValueError) as e:
            sock.close()
            raise ConnectionClosed("websocket handshake: %s" % (str(e) or type(e).__name__)) from None

    @classmethod
    def _handshake(cls, sock: socket.socket, deadline: float, u: SplitResult, headers: Dict[str, str],
                   subprotocol: str) -> "WebSocket":
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
        ws = cls(sock)
        ws.deadline = deadline
        ws._arm()
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        status, resp_headers = ws._read_http_head()
        if status != 101:
            body = ws._read_http_body(resp_headers)
            sock.close()
            raise HandshakeError(status, resp_headers, body)
        accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
        if resp_headers.get("sec-websocket-accept") != accept:
            sock.close()
            raise ConnectionClosed("websocket handshake: wrong Sec-WebSocket-Accept")
        ws.deadline = None
        return ws

    def _recv_some(self, n: int) -> bytes:
        self._arm()
        return self.sock.recv(n)

    def _read_http_head(self) -> Tuple[int, Dict[str, str]]:
        while b"\r\n\r\n" not in self._buf:
            if len(self._buf) > 64 << 10:
                raise ConnectionClosed("websocket handshake: answer head too long")
            chunk = self._recv_some(4096)
            if not chunk:
                raise ConnectionClosed("websocket handshake: connection closed")
            self._buf += chunk
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        first = lines[0].split(" ")
        if len(first) < 2 or not first[0].startswith("HTTP/") or not first[1].isdigit():
            raise ConnectionClosed("websocket handshake: the answer is not HTTP")
        status = int(first[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers

    def _read_http_body(self, headers: Dict[str, str]) -> bytes:
        cl = headers.get("content-length", "0")
        n = min(int(cl), 64 << 10) if cl.isdigit() else 0
        while len(self._buf) < n:
            chunk = self._recv_some(4096)
            if not chunk:
                break
            self._buf += chunk
        return self._buf[:n]

    def _recv_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._recv_some(max(65536, n - len(self._buf)))
            if not chunk:
                raise ConnectionClosed("connection closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def send(self, opcode: int, payload: bytes) -> None:
        """Sends one frame, masked as a client must."""
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 4096 else _mask(payload, mask)
        self._arm()
        self.sock.sendall(head + mask + masked)

    def recv(self) -> Tuple[int, bytes]:
        """Returns the next data message (opcode, payload); answers pings;
        raises ConnectionClosed at a close frame or the end of the stream."""
        opcode, parts, size = None, [], 0
        while True:
            b0, b1 = self._recv_exact(2)
            fin, op = b0 & 0x80, b0 & 0x0F
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._recv_exact(8))[0]
            mask = self._recv_exact(4) if b1 & 0x80 else None
            if n > MAX_MESSAGE or size + n > MAX_MESSAGE:
                raise ConnectionClosed("message too large")
            data = self._recv_exact(n)
            if mask:
                data = _mask(data, mask)
            if op == OP_PING:
                self.send(OP_PONG, data)
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                try:
                    self.send(OP_CLOSE, data[:2])
                except OSError:
                    pass
                raise ConnectionClosed("closed by the server")
            if op != OP_CONT:
                opcode = op
            parts.append(data)
            size += n
            if fin:
                return opcode if opcode is not None else OP_BINARY, b"".join(parts)

    def close(self) -> None:
        try:
            self.send(OP_CLOSE, struct.pack("!H", 1000))
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _mask(data: bytes, mask: bytes) -> bytes:
    """XORs data with the 4-byte mask, fast for large payloads."""
    n = len(data)
    if n == 0:
        return data
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")
