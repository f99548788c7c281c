"""The SDK against a hostile server and a hostile sandbox, with no hiloop:
a stand-in HTTP server on 127.0.0.1 answers with tar streams built here
(the kubectl cp CVEs' shapes among them), exec streams that stall or
flood, and the SDK must refuse or skip safely."""

import asyncio
import base64
import datetime
import hashlib
import http.client
import http.server
import io
import json
import os
import shutil
import stat
import struct
import subprocess
import tarfile
import tempfile
import threading
import unittest
from typing import Any, Callable, Dict, List, Optional, Tuple
from unittest import mock

import hiloop
from hiloop import _core, aio

Member = Tuple[tarfile.TarInfo, bytes]


def entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", mode: int = 0o644, linkname: str = "",
          pax: Optional[Dict[str, str]] = None) -> Member:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.linkname, ti.size = kind, mode, linkname, len(data)
    if pax:
        ti.pax_headers = dict(pax)
    return ti, data


def build_tar(*members: Member, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for ti, data in members:
            tf.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return buf.getvalue()


def ws_frame(op: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | op, n])
    elif n < 1 << 16:
        head = bytes([0x80 | op, 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x80 | op, 127]) + struct.pack("!Q", n)
    return head + payload


def read_frame(f: Any) -> bytes:
    """One masked client frame's payload."""
    b0, b1 = f.read(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", f.read(8))[0]
    mask = f.read(4)
    return bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))


class Stand:
    """A stand-in hiloop on 127.0.0.1: handler(method, request handler)
    answers every request; what came in is kept in requests."""

    def __init__(self, test: unittest.TestCase, handler: Callable[[str, http.server.BaseHTTPRequestHandler], None],
                 keepalive: bool = False):
        self.requests: List[Tuple[str, str, Dict[str, str], bytes]] = []
        # connections counts the TCP connections the server accepted.
        self.connections = 0
        stand = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                stand.connections += 1

            def _any(self, method: str) -> None:
                body = b""
                if self.headers.get("Content-Length"):
                    body = self.rfile.read(int(self.headers["Content-Length"]))
                stand.requests.append((method, self.path, dict(self.headers), body))
                handler(method, self)
                self.close_connection = not keepalive

            def do_GET(self) -> None:
                self._any("GET")

            def do_PUT(self) -> None:
                self._any("PUT")

            def do_POST(self) -> None:
                self._any("POST")

            def do_PATCH(self) -> None:
                self._any("PATCH")

            def do_DELETE(self) -> None:
                self._any("DELETE")

            def log_message(self, *args: object) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        test.addCleanup(self.srv.server_close)
        test.addCleanup(self.srv.shutdown)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        self.client = hiloop.Client(self.url, "hl_x", wake=False)
        test.addCleanup(self.client.close)
        self.sandbox = hiloop.Sandbox(self.client, {"id": "sbx_1", "state": "running"})

    def aio(self) -> aio.Sandbox:
        """The sandbox through a new asyncio client; call it in the event
        loop that will use it."""
        return aio.Sandbox(aio.Client(self.url, "hl_x", wake=False), {"id": "sbx_1", "state": "running"})


def answer(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes, content_type: str,
           length: Optional[int] = None) -> None:
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(body) if length is None else length))
    h.end_headers()
    h.wfile.write(body)


class DownloadDirTest(unittest.TestCase):
    """download_dir writes what a hostile sandbox sends only as fresh
    directories and regular files inside the destination."""

    def setUp(self) -> None:
        self.base = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.base)
        self.outside = os.path.join(self.base, "outside")
        os.mkdir(self.outside)
        with open(os.path.join(self.outside, "target"), "wb") as f:
            f.write(b"secret")
        self.parent = os.path.join(self.base, "parent")
        os.mkdir(self.parent)
        self.dest = os.path.join(self.parent, "dest")
        old = os.umask(0o022)
        self.addCleanup(os.umask, old)

    def serve_tar(self, data: bytes, length: Optional[int] = None) -> Stand:
        return Stand(self, lambda m, h: answer(h, 200, data, "application/x-tar", length))

    def download(self, data: bytes, **kw: Any) -> None:
        self.serve_tar(data).sandbox.files.download_dir("/work/tree", self.dest, **kw)

    def refused(self, data: bytes, code: str, cls: type = hiloop.ExtractError, **kw: Any) -> None:
        with self.assertRaises(cls) as e:
            self.download(data, **kw)
        self.assertEqual(e.exception.code, code)
        self.assertIsInstance(e.exception, hiloop.HiloopError)

    def assert_outside_untouched(self) -> None:
        self.assertEqual(sorted(os.listdir(self.outside)), ["target"])
        with open(os.path.join(self.outside, "target"), "rb") as f:
            self.assertEqual(f.read(), b"secret")

    def assert_nothing_left(self) -> None:
        self.assertEqual(os.listdir(self.parent), [])

    def read(self, *name: str) -> bytes:
        with open(os.path.join(self.dest, *name), "rb") as f:
            return f.read()

    def mode(self, *name: str) -> int:
        return stat.S_IMODE(os.lstat(os.path.join(self.dest, *name)).st_mode)

    def test_plain_tree(self) -> None:
        self.download(build_tar(entry("./", tarfile.DIRTYPE, mode=0o755), entry("./a.txt", data=b"a"),
                                entry("./sub/", tarfile.DIRTYPE, mode=0o755), entry("./sub/b.txt", data=b"bee"),
                                entry("deeper/c.py", data=b"print(1)\n")))
        self.assertEqual((self.read("a.txt"), self.read("sub", "b.txt"), self.read("deeper", "c.py")),
                         (b"a", b"bee", b"print(1)\n"))
        self.assertEqual(os.listdir(self.parent), ["dest"])

    def test_gnu_long_names_and_255_byte_name(self) -> None:
        long_dir = "d" * 120
        name = "n" * 255
        self.download(build_tar(entry(long_dir + "/" + name, data=b"x"), fmt=tarfile.GNU_FORMAT))
        self.assertEqual(self.read(long_dir, name), b"x")

    def test_deep_and_long_names_refused(self) -> None:
        self.download(build_tar(entry("a/" * 128 + "f", data=b"deepest")))
        self.assertEqual(self.read(*(["a"] * 128 + ["f"])), b"deepest")
        shutil.rmtree(self.dest)
        self.refused(build_tar(entry("a/" * 129 + "f", data=b"x")), "invalid_path")
        self.assert_nothing_left()
        self.refused(build_tar(entry("b" * 200 + "/" + "c/" * 2000 + "f", data=b"x")), "invalid_path")
        self.assert_nothing_left()

    def test_existing_destination_refused(self) -> None:
        os.mkdir(self.dest)
        with open(os.path.join(self.dest, "keep"), "wb") as f:
            f.write(b"mine")
        stand = self.serve_tar(build_tar(entry("keep", data=b"theirs"), entry("new", data=b"n")))
        with self.assertRaises(FileExistsError):
            stand.sandbox.files.download_dir("/work/tree", self.dest)
        self.assertEqual(sorted(os.listdir(self.dest)), ["keep"])
        self.assertEqual(self.read("keep"), b"mine")

    def test_existing_empty_destination_refused(self) -> None:
        os.mkdir(self.dest)
        with self.assertRaises(FileExistsError):
            self.download(build_tar(entry("a", data=b"a")))
        self.assertEqual(os.listdir(self.dest), [])

    def test_destination_symlink_refused(self) -> None:
        os.symlink(self.outside, self.dest)
        with self.assertRaises(FileExistsError):
            self.download(build_tar(entry("target", data=b"pwned"), entry("x", data=b"x")))
        self.assert_outside_untouched()

    def test_overwrite_merges_and_replaces(self) -> None:
        os.mkdir(self.dest)
        for name in ("keep", "replace"):
            with open(os.path.join(self.dest, name), "wb") as f:
                f.write(b"old " + name.encode())
        os.chmod(os.path.join(self.dest, "replace"), 0o600)
        self.download(build_tar(entry("replace", data=b"new", mode=0o6777), entry("n" * 255, data=b"long")),
                      overwrite=True)
        self.assertEqual((self.read("keep"), self.read("replace"), self.read("n" * 255)),
                         (b"old keep", b"new", b"long"))
        self.assertEqual(self.mode("replace"), 0o755)
        self.assertEqual(sorted(os.listdir(self.dest)), sorted(["keep", "replace", "n" * 255]))

    def test_overwrite_does_not_write_through_hard_link(self) -> None:
        os.mkdir(self.dest)
        os.link(os.path.join(self.outside, "target"), os.path.join(self.dest, "linked"))
        self.download(build_tar(entry("linked", data=b"pwned")), overwrite=True)
        self.assertEqual(self.read("linked"), b"pwned")
        self.assert_outside_untouched()

    def test_overwrite_missing_destination_is_made(self) -> None:
        self.download(build_tar(entry("a", data=b"a")), overwrite=True)
        self.assertEqual(self.read("a"), b"a")

    def test_failed_download_leaves_nothing(self) -> None:
        self.refused(build_tar(entry("a", data=b"a"), entry("sub/b", data=b"b"), entry("../escape", data=b"x")),
                     "invalid_path")
        self.assert_nothing_left()
        self.assertFalse(os.path.exists(os.path.join(self.base, "escape")))

    def test_cut_stream_leaves_nothing(self) -> None:
        data = build_tar(entry("a", data=b"a" * 5000), entry("b", data=b"b" * 5000))
        with self.assertRaises(Exception):
            self.serve_tar(data[:6000], length=len(data)).sandbox.files.download_dir("/work/tree", self.dest)
        self.assert_nothing_left()

    def test_missing_end_marker_refused(self) -> None:
        data = build_tar(entry("a", data=b"a"))
        self.refused(data[:1024], "invalid_tar")
        self.assert_nothing_left()

    def test_path_traversal_refused(self) -> None:
        # CVE-2019-11249 and the lexical half of CVE-2019-11246.
        for name in ("../escape", "a/../../escape", "/abs/escape", "//abs", "./../escape", "..", "a/b/../../.."):
            with self.subTest(name=name):
                self.refused(build_tar(entry(name, data=b"x")), "invalid_path")
                self.assert_nothing_left()
        self.refused(build_tar(entry("ok", pax={"path": "../pax-escape"})), "invalid_path")
        self.refused(build_tar(entry("x" * 150 + "/../../escape", data=b"x"), fmt=tarfile.GNU_FORMAT), "invalid_path")
        self.assert_nothing_left()
        self.assertEqual(sorted(os.listdir(self.base)), ["outside", "parent"])

    def test_symlink_then_file_through_it(self) -> None:
        # CVE-2019-1002101, CVE-2019-11246: a link in the tar, then entries
        # through it. The link is skipped, so the entries land in a real
        # directory of that name.
        self.download(build_tar(entry("evil", tarfile.SYMTYPE, linkname=self.outside),
                                entry("evil/target", data=b"pwned"),
                                entry("root", tarfile.SYMTYPE, linkname="/"),
                                entry("dots", tarfile.SYMTYPE, linkname="../../.."),
                                entry("dots/x", data=b"x")))
        self.assertTrue(stat.S_ISDIR(os.lstat(os.path.join(self.dest, "evil")).st_mode))
        self.assertEqual(self.read("evil", "target"), b"pwned")
        self.assertFalse(os.path.lexists(os.path.join(self.dest, "root")))
        self.assert_outside_untouched()

    def test_hard_link_skipped(self) -> None:
        # CVE-2019-11251's hard-link twin: a link to a file outside, then a
        # regular entry of the same name that a naive extractor writes
        # through the link.
        target = os.path.join(self.outside, "target")
        self.download(build_tar(entry("h", tarfile.LNKTYPE, linkname=target),
                                entry("h2", tarfile.LNKTYPE, linkname="../../outside/target"),
                                entry("h", data=b"pwned")))
        self.assertEqual(self.read("h"), b"pwned")
        self.assertFalse(os.path.lexists(os.path.join(self.dest, "h2")))
        self.assertEqual(os.lstat(os.path.join(self.dest, "h")).st_nlink, 1)
        self.assert_outside_untouched()

    def test_devices_and_fifos_skipped(self) -> None:
        self.download(build_tar(entry("null", tarfile.CHRTYPE, mode=0o666), entry("disk", tarfile.BLKTYPE),
                                entry("fifo", tarfile.FIFOTYPE), entry("cont", tarfile.CONTTYPE, data=b"c"),
                                entry("file", data=b"f")))
        self.assertEqual(os.listdir(self.dest), ["file"])

    def test_setuid_dropped_and_umask_respected(self) -> None:
        os.umask(0o027)
        self.download(build_tar(entry("suid", data=b"x", mode=0o4777), entry("sgid", data=b"x", mode=0o2755),
                                entry("d/", tarfile.DIRTYPE, mode=0o1777), entry("ro", data=b"x", mode=0o444)))
        self.assertEqual((self.mode("suid"), self.mode("sgid"), self.mode("d"), self.mode("ro")),
                         (0o750, 0o750, 0o750, 0o440))

    def test_pre_existing_symlink_not_followed(self) -> None:
        # CVE-2019-11251's shape against a destination that already holds
        # a link out, which only overwrite=True lets a download reach.
        os.mkdir(self.dest)
        os.symlink(self.outside, os.path.join(self.dest, "link"))
        os.symlink(os.path.join(self.outside, "target"), os.path.join(self.dest, "flink"))
        for tar in (build_tar(entry("link/target", data=b"pwned")),
                    build_tar(entry("link/", tarfile.DIRTYPE), entry("link/new", data=b"pwned")),
                    build_tar(entry("link/deeper/new", data=b"pwned"))):
            self.refused(tar, "path_conflict", overwrite=True)
        self.assert_outside_untouched()
        # A file entry in a link's place replaces the link, never its target.
        self.download(build_tar(entry("flink", data=b"mine now")), overwrite=True)
        self.assertTrue(stat.S_ISREG(os.lstat(os.path.join(self.dest, "flink")).st_mode))
        self.assertEqual(self.read("flink"), b"mine now")
        self.assert_outside_untouched()

    def test_duplicate_file_refused_without_overwrite(self) -> None:
        self.refused(build_tar(entry("a", data=b"1"), entry("a", data=b"2")), "path_conflict")
        self.assert_nothing_left()
        self.refused(build_tar(entry("a", data=b"1"), entry("a/", tarfile.DIRTYPE)), "path_conflict")
        self.refused(build_tar(entry("a/", tarfile.DIRTYPE), entry("a", data=b"1")), "path_conflict")
        self.assert_nothing_left()

    def test_sparse_refused(self) -> None:
        gnu = entry("sparse", tarfile.GNUTYPE_SPARSE, data=b"")
        self.refused(build_tar(gnu, fmt=tarfile.GNU_FORMAT), "sparse_entry")
        for pax in ({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s",
                     "GNU.sparse.realsize": "1048576"},
                    {"GNU.sparse.size": "1048576", "GNU.sparse.numblocks": "1", "GNU.sparse.offset": "0",
                     "GNU.sparse.numbytes": "1"}):
            self.refused(build_tar(entry("s", data=b"x", pax=pax)), "sparse_entry")
        self.assert_nothing_left()

    def test_bytes_capped(self) -> None:
        self.refused(build_tar(entry("big", data=b"x" * 2000)), "extract_limit", hiloop.LimitError, max_bytes=1000)
        self.refused(build_tar(entry("a", data=b"x" * 600), entry("b", data=b"x" * 600)), "extract_limit",
                     hiloop.LimitError, max_bytes=1000)
        self.assert_nothing_left()
        self.download(build_tar(entry("a", data=b"x" * 600), entry("b", data=b"x" * 400)), max_bytes=1000)
        self.assertEqual(len(self.read("a")) + len(self.read("b")), 1000)

    def test_declared_size_past_stream_refused(self) -> None:
        # A header that declares more than the stream holds is a tar that
        # ended early, not a file written short.
        data = bytearray(build_tar(entry("a", data=b"x" * 100)))
        ti = tarfile.TarInfo("a")
        ti.size = 1 << 20
        data[:512] = ti.tobuf(tarfile.USTAR_FORMAT)
        self.refused(bytes(data), "invalid_tar")
        self.assert_nothing_left()

    def test_entries_capped(self) -> None:
        members = [entry("l%d" % i, tarfile.SYMTYPE, linkname="x") for i in range(3)] + [entry("d/", tarfile.DIRTYPE)]
        self.refused(build_tar(*members), "extract_limit", hiloop.LimitError, max_entries=3)
        self.assert_nothing_left()
        self.download(build_tar(*members), max_entries=4)
        self.assertEqual(os.listdir(self.dest), ["d"])

    def test_large_pax_header_refused(self) -> None:
        self.refused(build_tar(entry("a", data=b"a", pax={"comment": "x" * (2 << 20)})), "invalid_tar")
        self.assert_nothing_left()

    def test_bad_pax_refused(self) -> None:
        for pax in ({"size": "9" * 5000}, {"size": "-1"}):
            self.refused(build_tar(entry("a", data=b"a", pax=pax)), "invalid_tar")
        data = build_tar(entry("a", data=b"a", pax={"path": "a" * 200}))
        self.refused(data.replace(b" path=", b" path ", 1), "invalid_tar")
        self.assertIn(b"210 path=", data)
        self.refused(data.replace(b"210 path=", b"999 path=", 1), "invalid_tar")
        self.refused(data.replace(b"210 path=", b"209 path=", 1), "invalid_tar")
        self.assert_nothing_left()

    def test_bad_checksum_refused(self) -> None:
        data = bytearray(build_tar(entry("a", data=b"a"), fmt=tarfile.USTAR_FORMAT))
        data[0] = ord("b")
        self.refused(bytes(data), "invalid_tar")

    def test_not_a_tar(self) -> None:
        stand = Stand(self, lambda m, h: answer(h, 200, b"plain", "application/octet-stream"))
        with self.assertRaises(hiloop.ConflictError):
            stand.sandbox.files.download_dir("/work/f", self.dest)
        self.assert_nothing_left()


@unittest.skipUnless(shutil.which("tar"), "needs tar")
class RealTarTest(unittest.TestCase):
    """download_dir reads what tar -c writes in a sandbox (the server's
    `tar -c -f - -C DIR .`), in each of its formats."""

    def tree(self, long: bool) -> str:
        src = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, src)
        files = {"a.txt": b"a", "empty": b"", "sub/b.bin": os.urandom(70000), "sub/deeper/c.py": b"print(1)\n",
                 "h\u00e9llo w\u00f6rld": b"unicode"}
        if long:
            files["x" * 90 + "/" + "y" * 90 + "/" + "z" * 120] = b"long path"
            files["n" * 255] = b"long name"
        for name, data in files.items():
            os.makedirs(os.path.join(src, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(src, name), "wb") as f:
                f.write(data)
        os.chmod(os.path.join(src, "sub", "deeper", "c.py"), 0o750)
        os.symlink("/etc/passwd", os.path.join(src, "link"))
        return src

    def test_formats(self) -> None:
        old = os.umask(0o022)
        self.addCleanup(os.umask, old)
        for fmt, long in (("gnu", True), ("posix", True), ("oldgnu", True), ("ustar", False), ("v7", False)):
            with self.subTest(format=fmt):
                src = self.tree(long)
                data = subprocess.run(["tar", "-c", "-f", "-", "--format=" + fmt, "-C", src, "."],
                                      check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
                stand = Stand(self, lambda m, h: answer(h, 200, data, "application/x-tar"))
                base = tempfile.mkdtemp()
                self.addCleanup(shutil.rmtree, base)
                dest = os.path.join(base, "d")
                stand.sandbox.files.download_dir("/work", dest)
                self.assertEqual(snapshot(dest), {k: v for k, v in snapshot(src).items() if k != "link"})


def snapshot(root: str) -> Dict[str, Tuple[int, bytes]]:
    """Every directory and regular file under root: its mode and content."""
    out: Dict[str, Tuple[int, bytes]] = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            content = b""
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    content = f.read()
            elif not stat.S_ISDIR(st.st_mode):
                content = b"<other>"
            out[os.path.relpath(p, root)] = (stat.S_IMODE(st.st_mode), content)
    return out


class UploadDirTest(unittest.TestCase):
    def test_tar_names_no_owner(self) -> None:
        local = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, local)
        os.mkdir(os.path.join(local, "sub"))
        for name in ("a.txt", "sub/b.txt"):
            with open(os.path.join(local, name), "wb") as f:
                f.write(name.encode())
        stand = Stand(self, lambda m, h: answer(h, 200, json.dumps(
            {"path": "/w", "size": 1, "sha256": "x"}).encode(), "application/json"))
        stand.sandbox.files.upload_dir(local, "/w")
        method, _, headers, body = stand.requests[-1]
        self.assertEqual((method, headers["Content-Type"]), ("PUT", "application/x-tar"))
        with tarfile.open(fileobj=io.BytesIO(body)) as tf:
            members = tf.getmembers()
        self.assertEqual(sorted(m.name for m in members), ["a.txt", "sub", "sub/b.txt"])
        for m in members:
            self.assertEqual((m.uid, m.gid, m.uname, m.gname), (0, 0, "", ""), m.name)
            self.assertFalse(any(k in m.pax_headers for k in ("uid", "gid", "uname", "gname")), m.pax_headers)


class ReadTest(unittest.TestCase):
    def serve(self, declared: int, sent: int) -> Stand:
        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", str(declared))
            h.end_headers()
            try:
                for _ in range(sent >> 20):
                    h.wfile.write(b"x" * (1 << 20))
                h.wfile.write(b"x" * (sent & ((1 << 20) - 1)))
            except OSError:
                pass
        return Stand(self, handler)

    def test_read_capped(self) -> None:
        stand = self.serve(1 << 40, 8 << 20)
        with self.assertRaises(hiloop.LimitError) as e:
            stand.sandbox.files.read("/f", max_bytes=1 << 20)
        self.assertEqual(e.exception.code, "output_limit")
        self.assertEqual(len(self.serve(1 << 20, 1 << 20).sandbox.files.read("/f", max_bytes=1 << 20)), 1 << 20)

    def test_cut_short_raises(self) -> None:
        stand = self.serve(3 << 20, 2 << 20)
        with self.assertRaises(http.client.IncompleteRead):
            stand.sandbox.files.read("/f")
        with self.assertRaises(http.client.IncompleteRead):
            stand.sandbox.files.read_to("/f", io.BytesIO())


class PlainHTTPTest(unittest.TestCase):
    def test_loopback_only(self) -> None:
        for url in ("http://127.attacker.example", "http://127.0.0.1.nip.io:8080", "http://localhost.attacker.example",
                    "http://10.1.2.3:8080", "http://[fe80::1]:8080", "http://127.1:8080", "http://0x7f000001"):
            with self.subTest(url=url):
                with self.assertRaises(ValueError):
                    hiloop.Client(url, "hl_x")
        for url in ("http://127.0.0.1:8080", "http://127.9.8.7", "http://localhost:1", "http://LOCALHOST",
                    "http://[::1]:8080", "https://127.attacker.example"):
            with self.subTest(url=url):
                hiloop.Client(url, "hl_x")


class ExecServer:
    """A stand-in exec WebSocket: it answers the upgrade, reads the
    command, then runs behave(write) on the connection."""

    def __init__(self, test: unittest.TestCase, behave: Callable[[Callable[[bytes], None]], None]) -> None:
        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            key = h.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            h.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Protocol: hiloop.exec.v1\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            try:
                self.commands.append(json.loads(read_frame(h.rfile))["command"])
                behave(h.wfile.write)
                # Until the client closes: closing with its close frame
                # unread would reset the connection under what was sent.
                while h.rfile.read(4096):
                    pass
            except OSError:
                pass
        self.commands: List[List[str]] = []
        self.stand = Stand(test, handler)


class ExecTest(unittest.TestCase):
    def test_stalled_server_ends_at_deadline(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)
        srv = ExecServer(self, lambda write: release.wait())
        with mock.patch.object(_core, "EXEC_MARGIN", 0.2):
            with self.assertRaises(hiloop.StreamLostError) as e:
                srv.stand.sandbox.exec(["sleep", "1"], timeout=0.1)
        self.assertEqual(e.exception.code, "stream_lost")

    def test_drip_fed_handshake_ends_at_deadline(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)

        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            h.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\n")
            # One byte at a time, each within any per-read timeout.
            while not release.wait(0.05):
                h.wfile.write(b"X")
        stand = Stand(self, handler)
        with mock.patch.object(_core, "HANDSHAKE_WAIT", 0.2):
            with self.assertRaises(hiloop.StreamLostError):
                stand.sandbox.exec(["true"])

    def test_garbled_answers(self) -> None:
        for answer_bytes in (b"garbage\r\n\r\n", b"HTTP/1.1 abc\r\n\r\n", b"HTTP/1.1 101 OK\r\n\r\n"):
            with self.subTest(answer=answer_bytes):
                stand = Stand(self, lambda m, h: h.wfile.write(answer_bytes))
                with self.assertRaises(hiloop.StreamLostError):
                    stand.sandbox.exec(["true"])
        for frame in (b"not json", b"[1]", b'{"exit_code": "0"}', b'{"exit_code": true}', b'{"error": "x"}'):
            with self.subTest(frame=frame):
                srv = ExecServer(self, lambda write: write(ws_frame(2, b"\x03" + frame)))
                with self.assertRaises(hiloop.StreamLostError):
                    srv.stand.sandbox.exec(["true"])

    def flood(self, frames: int) -> Callable[[Callable[[bytes], None]], None]:
        def behave(write: Callable[[bytes], None]) -> None:
            for _ in range(frames):
                write(ws_frame(2, b"\x01" + b"o" * (1 << 20)))
                write(ws_frame(2, b"\x02" + b"e" * 1000))
            write(ws_frame(2, b"\x03" + json.dumps({"exit_code": 0}).encode()))
        return behave

    def test_flood_capped(self) -> None:
        srv = ExecServer(self, self.flood(64))
        with self.assertRaises(hiloop.LimitError) as e:
            srv.stand.sandbox.exec(["yes"], max_output=3 << 20)
        self.assertEqual(e.exception.code, "output_limit")

    def test_flood_to_callback_not_capped(self) -> None:
        srv = ExecServer(self, self.flood(8))
        got: List[int] = []
        r = srv.stand.sandbox.exec(["yes"], on_stdout=lambda b: got.append(len(b)), max_output=1 << 20)
        self.assertEqual((r.exit_code, sum(got), len(r.stderr)), (0, 8 << 20, 8000))

    def test_output_within_cap(self) -> None:
        srv = ExecServer(self, self.flood(2))
        r = srv.stand.sandbox.exec(["yes"], max_output=2 << 20)
        self.assertEqual((r.exit_code, len(r.stdout), srv.commands), (0, 2 << 20, [["yes"]]))

    def test_run_answer_capped(self) -> None:
        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(1 << 40))
            h.end_headers()
            try:
                h.wfile.write(b'{"stdout":"')
                for _ in range(64):
                    h.wfile.write(b"x" * (1 << 20))
            except OSError:
                pass
        stand = Stand(self, handler)
        with mock.patch.object(_core, "MAX_ANSWER", 4 << 20):
            with self.assertRaises(hiloop.LimitError) as e:
                stand.sandbox.run("yes")
        self.assertEqual(e.exception.code, "output_limit")

    def test_run_stalled_answer_ends_at_deadline(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)

        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Length", str(1 << 20))
            h.end_headers()
            h.wfile.write(b"{")
            # One byte at a time, each within any per-read timeout.
            while not release.wait(0.05):
                h.wfile.write(b" ")
        stand = Stand(self, handler)
        with mock.patch.object(_core, "RUN_MARGIN", 0.3):
            with self.assertRaises(TimeoutError):
                stand.sandbox.run("true", timeout=0.1)


def sandbox_json(h: http.server.BaseHTTPRequestHandler, status: int = 200) -> None:
    answer(h, status, json.dumps({"id": "sbx_1", "state": "running"}).encode(), "application/json")


def run_async(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


class AioExecTest(unittest.TestCase):
    """hiloop.aio against the hostile exec streams and answers ExecTest and
    ReadTest use: the same refusals, from the same core."""

    def exec(self, srv: "ExecServer", *args: Any, **kw: Any) -> Any:
        async def go() -> Any:
            sb = srv.stand.aio()
            try:
                return await sb.exec(*args, **kw)
            finally:
                await sb._c.close()
        return run_async(go)

    def test_stalled_server_ends_at_deadline(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)
        srv = ExecServer(self, lambda write: release.wait())
        with mock.patch.object(_core, "EXEC_MARGIN", 0.2):
            with self.assertRaises(hiloop.StreamLostError) as e:
                self.exec(srv, ["sleep", "1"], timeout=0.1)
        self.assertEqual(e.exception.code, "stream_lost")

    def test_drip_fed_handshake_ends_at_deadline(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)

        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            h.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\n")
            while not release.wait(0.05):
                h.wfile.write(b"X")
        stand = Stand(self, handler)
        with mock.patch.object(_core, "HANDSHAKE_WAIT", 0.2):
            with self.assertRaises(hiloop.StreamLostError):
                self.exec(ExecServerOn(stand), ["true"])

    def test_garbled_answers(self) -> None:
        for answer_bytes in (b"garbage\r\n\r\n", b"HTTP/1.1 abc\r\n\r\n", b"HTTP/1.1 101 OK\r\n\r\n"):
            with self.subTest(answer=answer_bytes):
                stand = Stand(self, lambda m, h: h.wfile.write(answer_bytes))
                with self.assertRaises(hiloop.StreamLostError):
                    self.exec(ExecServerOn(stand), ["true"])
        for frame in (b"not json", b"[1]", b'{"exit_code": "0"}', b'{"exit_code": true}', b'{"error": "x"}'):
            with self.subTest(frame=frame):
                srv = ExecServer(self, lambda write: write(ws_frame(2, b"\x03" + frame)))
                with self.assertRaises(hiloop.StreamLostError):
                    self.exec(srv, ["true"])

    def test_refused_upgrade(self) -> None:
        stand = Stand(self, lambda m, h: answer(h, 404, json.dumps(
            {"error": {"code": "not_found", "message": "no", "request_id": "r9"}}).encode(), "application/json"))
        with self.assertRaises(hiloop.NotFoundError) as e:
            self.exec(ExecServerOn(stand), ["true"])
        self.assertEqual((e.exception.code, e.exception.request_id), ("not_found", "r9"))

    def test_flood(self) -> None:
        srv = ExecServer(self, ExecTest.flood(self, 64))  # type: ignore[arg-type]
        with self.assertRaises(hiloop.LimitError) as e:
            self.exec(srv, ["yes"], max_output=3 << 20)
        self.assertEqual(e.exception.code, "output_limit")
        srv = ExecServer(self, ExecTest.flood(self, 8))  # type: ignore[arg-type]
        got: List[int] = []
        r = self.exec(srv, ["yes"], on_stdout=lambda b: got.append(len(b)), max_output=1 << 20)
        self.assertEqual((r.exit_code, sum(got), len(r.stderr)), (0, 8 << 20, 8000))
        srv = ExecServer(self, ExecTest.flood(self, 2))  # type: ignore[arg-type]
        r = self.exec(srv, ["yes"], max_output=2 << 20)
        self.assertEqual((r.exit_code, len(r.stdout), srv.commands), (0, 2 << 20, [["yes"]]))

    def test_run_answer_capped_and_stalled(self) -> None:
        def big(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Length", str(1 << 40))
            h.end_headers()
            try:
                for _ in range(64):
                    h.wfile.write(b"x" * (1 << 20))
            except OSError:
                pass
        release = threading.Event()
        self.addCleanup(release.set)

        def stalled(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Length", str(1 << 20))
            h.end_headers()
            try:
                while not release.wait(0.05):
                    h.wfile.write(b" ")
            except OSError:
                pass

        async def run(stand: Stand, **kw: Any) -> Any:
            sb = stand.aio()
            try:
                return await sb.run("yes", **kw)
            finally:
                await sb._c.close()
        with mock.patch.object(_core, "MAX_ANSWER", 4 << 20):
            with self.assertRaises(hiloop.LimitError) as e:
                asyncio.run(run(Stand(self, big)))
        self.assertEqual(e.exception.code, "output_limit")
        with mock.patch.object(_core, "RUN_MARGIN", 0.3):
            with self.assertRaises(TimeoutError):
                asyncio.run(run(Stand(self, stalled), timeout=0.1))

    def test_read_capped_and_cut(self) -> None:
        async def read(stand: Stand, **kw: Any) -> bytes:
            sb = stand.aio()
            try:
                return await sb.files.read("/f", **kw)
            finally:
                await sb._c.close()
        with self.assertRaises(hiloop.LimitError) as e:
            asyncio.run(read(ReadTest.serve(self, 1 << 40, 8 << 20), max_bytes=1 << 20))  # type: ignore[arg-type]
        self.assertEqual(e.exception.code, "output_limit")
        with self.assertRaises(http.client.IncompleteRead):
            asyncio.run(read(ReadTest.serve(self, 3 << 20, 2 << 20)))  # type: ignore[arg-type]

    def test_download_dir_refuses_traversal(self) -> None:
        base = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, base)
        data = build_tar(entry("ok.txt", data=b"ok"), entry("../escape.txt", data=b"x"))
        stand = Stand(self, lambda m, h: answer(h, 200, data, "application/x-tar"))

        async def go() -> None:
            sb = stand.aio()
            try:
                await sb.files.download_dir("/t", os.path.join(base, "d"))
            finally:
                await sb._c.close()
        with self.assertRaises(hiloop.ExtractError) as e:
            asyncio.run(go())
        self.assertEqual(e.exception.code, "invalid_path")
        self.assertEqual(os.listdir(base), [])
        good = build_tar(entry("sub/", kind=tarfile.DIRTYPE, mode=0o755), entry("sub/a.txt", data=b"a" * 300000))
        stand = Stand(self, lambda m, h: answer(h, 200, good, "application/x-tar"))

        async def fine() -> None:
            sb = stand.aio()
            try:
                await sb.files.download_dir("/t", os.path.join(base, "d"))
            finally:
                await sb._c.close()
        asyncio.run(fine())
        with open(os.path.join(base, "d", "sub", "a.txt"), "rb") as f:
            self.assertEqual(f.read(), b"a" * 300000)


def ExecServerOn(stand: Stand) -> Any:
    """An object with the stand, for AioExecTest.exec."""
    class On:
        pass
    on = On()
    on.stand = stand  # type: ignore[attr-defined]
    return on


class KeepAliveTest(unittest.TestCase):
    """Both clients send their calls over one kept-alive connection, an
    error answer included, and a connection the server closed is not
    used again."""

    def handler(self, method: str, h: http.server.BaseHTTPRequestHandler) -> None:
        if h.path.endswith("/missing"):
            answer(h, 404, json.dumps({"error": {"code": "not_found", "message": "no"}}).encode(), "application/json")
        else:
            sandbox_json(h)

    def sync_calls(self, stand: Stand) -> None:
        sb = stand.sandbox
        sb.refresh()
        sb.touch()
        sb.update(ttl="1h")
        with self.assertRaises(hiloop.NotFoundError):
            stand.client.sandboxes.get("missing")
        sb.refresh()

    async def aio_calls(self, stand: Stand) -> None:
        sb = stand.aio()
        try:
            await sb.refresh()
            await sb.touch()
            await sb.update(ttl="1h")
            with self.assertRaises(hiloop.NotFoundError):
                await sb._c.sandboxes.get("missing")
            await sb.refresh()
        finally:
            await sb._c.close()

    def test_one_connection(self) -> None:
        stand = Stand(self, self.handler, keepalive=True)
        self.sync_calls(stand)
        self.assertEqual((len(stand.requests), stand.connections), (5, 1))
        asyncio.run(self.aio_calls(stand))
        self.assertEqual((len(stand.requests), stand.connections), (10, 2))
        self.assertEqual([r[0] for r in stand.requests[:5]], ["GET", "POST", "PATCH", "GET", "GET"])
        self.assertEqual(stand.requests[2][3], b'{"ttl": "1h"}')

    def test_closed_connection_not_reused(self) -> None:
        stand = Stand(self, self.handler)

        def gets() -> None:
            for _ in range(5):
                stand.sandbox.refresh()

        async def aio_gets() -> None:
            sb = stand.aio()
            try:
                for _ in range(5):
                    await sb.refresh()
            finally:
                await sb._c.close()
        gets()
        asyncio.run(aio_gets())
        self.assertEqual(stand.connections, 10)


class AioRetryTest(unittest.TestCase):
    def test_create_retries_with_one_key(self) -> None:
        answers = [503, 429, 201]

        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            status = answers[min(len(stand.requests), len(answers)) - 1]
            if status < 400:
                answer(h, status, json.dumps({"id": "sbx_1", "state": "pending"}).encode(), "application/json")
                return
            body = json.dumps({"error": {"code": "storage_unavailable", "message": "no"}}).encode()
            h.send_response(status)
            h.send_header("Retry-After", "0")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        stand = Stand(self, handler, keepalive=True)

        async def go() -> str:
            async with aio.Client(stand.url, "hl_x") as c:
                return (await c.sandboxes.create("busybox", wait=False)).id
        self.assertEqual(asyncio.run(go()), "sbx_1")
        keys = {r[2]["Idempotency-Key"] for r in stand.requests}
        self.assertEqual((len(stand.requests), len(keys)), (3, 1))


class CoreTest(unittest.TestCase):
    def test_durations(self) -> None:
        for v, want in (("1h", "1h"), ("0", "0"), (0, "0s"), (90, "90s"), (1.5, "1500ms"),
                        (datetime.timedelta(minutes=5), "300s"), (datetime.timedelta(milliseconds=250), "250ms")):
            with self.subTest(v=v):
                self.assertEqual(_core.duration(v, "ttl"), want)
        for bad in (True, None, [1]):
            with self.assertRaises(TypeError):
                _core.duration(bad, "ttl")  # type: ignore[arg-type]

    def test_sandbox_info(self) -> None:
        info = hiloop.SandboxInfo.from_json({
            "id": "sbx_1", "state": "running", "created_at": "2026-12-06T05:45:29.123456789Z",
            "last_activity_at": "0001-01-01T00:00:00Z", "expires_at": "2026-12-06T06:45:29+01:00",
            "exit_code": True, "labels": {"a": "b"}, "future_field": 7, "resources": None})
        self.assertEqual(info.created_at, datetime.datetime(2026, 12, 6, 5, 45, 29, 123456, datetime.timezone.utc))
        self.assertEqual(info.expires_at, datetime.datetime(2026, 12, 6, 5, 45, 29, tzinfo=datetime.timezone.utc))
        self.assertEqual(info.last_activity_at, datetime.datetime(1, 1, 1, tzinfo=datetime.timezone.utc))
        self.assertEqual((info.exit_code, info.labels, info.resources, info["future_field"]), (None, {"a": "b"}, {}, 7))
        self.assertEqual((info.get("nothing", 1), "labels" in info, info.updated_at), (1, True, None))
        for bad in ({"state": "running"}, [], {"id": 7}):
            with self.assertRaises(hiloop.HiloopError) as e:
                hiloop.SandboxInfo.from_json(bad)
            self.assertEqual(e.exception.code, "bad_answer")

    def test_run_result_encodings(self) -> None:
        r = _core.run_result({"stdout": "/wBh", "stderr": "", "encoding": "base64", "exit_code": 0})
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, b"\xff\x00a", b""))
        # An answer without encoding (an older server) is text.
        self.assertEqual(_core.run_result({"stdout": "/wBh", "stderr": ""}).stdout, b"/wBh")
        for bad in ({"stdout": "not base64!", "stderr": "", "encoding": "base64"},
                    {"stdout": "", "stderr": "", "encoding": "rot13"}, {"stdout": "", "stderr": "", "encoding": 7}):
            with self.assertRaises(hiloop.HiloopError) as e:
                _core.run_result(bad)
            self.assertEqual(e.exception.code, "bad_answer")

    def test_frames(self) -> None:
        r = _core.FrameReader()
        stream = (bytes([0x02, 3]) + b"\x01ab" + bytes([0x89, 1]) + b"p" + bytes([0x80, 2]) + b"cd"
                  + ws_frame(0x2, b"\x03{}") + ws_frame(0x8, b"\x03\xe8"))
        events = []
        for i in range(len(stream)):
            r.feed(stream[i:i + 1])
            ev = r.next()
            while ev is not None:
                events.append(ev)
                ev = r.next()
        self.assertEqual(events, [(_core.PING, 0, b"p"), (_core.MESSAGE, 2, b"\x01abcd"),
                                  (_core.MESSAGE, 2, b"\x03{}"), (_core.CLOSE, 0, b"\x03\xe8")])
        big = _core.FrameReader(bytes([0x82, 127]) + struct.pack("!Q", _core.MAX_MESSAGE + 1))
        with self.assertRaises(_core.ConnectionClosed):
            big.next()
        masked = _core.encode_frame(_core.OP_BINARY, b"x" * 5000)
        r = _core.FrameReader(masked)
        self.assertEqual(r.next(), (_core.MESSAGE, 2, b"x" * 5000))

    def test_resize_bounds(self) -> None:
        self.assertEqual(_core.resize_message(80, 24), b'\x04{"width": 80, "height": 24}')
        for w, h in ((0, 24), (80, 0), (1 << 16, 1)):
            with self.assertRaises(ValueError):
                _core.resize_message(w, h)
        with self.assertRaises(ValueError):
            _core.exec_url("http://x", "sbx_1", stdin=False, tty=True, timeout=None, wake=False)


if __name__ == "__main__":
    unittest.main()
