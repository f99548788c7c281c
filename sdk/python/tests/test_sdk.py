"""The Python SDK against a live hiloop (HILOOP_URL, HILOOP_TOKEN), as
`make test` runs it (e2e's TestPythonSDK). HILOOP_TEST_TOKEN_B is another
organization's key on the same server; HILOOP_TEST_NO_TAR says the
sandboxes' image has no tar."""

import datetime
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import unittest
import uuid
from typing import List
from urllib.parse import urlsplit

import hiloop
from hiloop import aio

LIVE = bool(os.environ.get("HILOOP_URL") and os.environ.get("HILOOP_TOKEN"))


def see_size(s: "hiloop.ExecSession", size: bytes) -> bytes:
    """Types empty lines into a session running `stty size` per line
    until it prints size (the terminal's size may reach it after the
    first line), and returns what it printed."""
    seen = b""
    for _ in range(100):
        s.write("\n")
        ev = s.recv()
        while ev is not None and b"\n" not in ev[1]:
            seen += ev[1]
            ev = s.recv()
        if ev is None:
            raise AssertionError("the session ended early: %r" % seen)
        seen += ev[1]
        if size in seen:
            return seen
    raise AssertionError("no %r in %r" % (size, seen))


def workdir() -> str:
    return "/tmp/hiloop-py-" + uuid.uuid4().hex[:12]


@unittest.skipUnless(LIVE and not os.environ.get("HILOOP_TEST_NO_TAR"), "needs a live hiloop (HILOOP_URL, HILOOP_TOKEN)")
class SandboxTest(unittest.TestCase):
    client: hiloop.Client
    sb: hiloop.Sandbox
    work: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = hiloop.Client()
        cls.sb = cls.client.sandboxes.create("busybox", ttl="1h", labels={"suite": "python"}, wait=True)
        cls.work = workdir()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.delete()

    def test_created_running(self) -> None:
        self.assertEqual(self.sb.state, "running")
        self.assertEqual(self.sb.refresh().state, "running")
        ids = [s.id for s in self.client.sandboxes.list(labels={"suite": "python"}, limit=1)]
        self.assertIn(self.sb.id, ids)
        self.assertIn("running", [e["to"] for e in self.sb.events()])

    def test_typed_info(self) -> None:
        info = self.sb.refresh().info
        self.assertIsInstance(info, hiloop.SandboxInfo)
        self.assertEqual((info.id, info.image, info.desired, info.labels), (self.sb.id, "busybox", "running",
                                                                           {"suite": "python"}))
        self.assertIsInstance(info.created_at, datetime.datetime)
        self.assertIsNotNone(info.created_at.tzinfo)  # type: ignore[union-attr]
        self.assertIsInstance(info.expires_at, datetime.datetime)
        # The answer's JSON still reads as before.
        self.assertEqual((self.sb.data["desired"], self.sb.data.get("image"), "labels" in self.sb.data),
                         ("running", "busybox", True))

    def test_update_ttl_and_idle_timeout(self) -> None:
        def utcnow() -> datetime.datetime:
            return datetime.datetime.now(datetime.timezone.utc)
        second = datetime.timedelta(seconds=1)
        for ttl, want in (("3h", datetime.timedelta(hours=3)), (90 * 60, datetime.timedelta(minutes=90))):
            asked = utcnow()
            expires = self.sb.set_ttl(ttl).info.expires_at
            assert expires is not None
            self.assertTrue(asked + want - second <= expires <= utcnow() + want + second, (ttl, asked, expires))
        self.assertEqual(self.sb.update(idle_timeout="30m").info.idle_timeout, "30m0s")
        asked = utcnow()
        sb = self.sb.update(ttl=datetime.timedelta(hours=2), idle_timeout=0)
        assert sb.info.expires_at is not None
        self.assertGreaterEqual(sb.info.expires_at, asked + datetime.timedelta(hours=2) - second)
        self.assertEqual(sb.info.idle_timeout, "0s")
        self.assertEqual(self.client.sandboxes.get(self.sb.id).info.idle_timeout, "0s")
        for kw, fld in (({"ttl": "forever"}, "ttl"), ({"ttl": "1000h"}, "ttl"), ({"idle_timeout": "soon"}, "idle_timeout"),
                        ({}, "ttl")):
            with self.subTest(kw=kw):
                with self.assertRaises(hiloop.InvalidRequestError) as e:
                    self.sb.update(**kw)  # type: ignore[arg-type]
                self.assertEqual((e.exception.code, e.exception.field), ("invalid_field", fld))
                self.assertTrue(e.exception.request_id)

    def test_touch(self) -> None:
        before = self.sb.refresh().info.last_activity_at
        assert before is not None
        after = self.sb.touch().info.last_activity_at
        assert after is not None
        self.assertGreaterEqual(after, before)
        self.assertEqual(self.sb.state, "running")

    def test_tty(self) -> None:
        # The exit code tells: output written just before a command ends
        # may be lost with its terminal on some runtimes (kwok's).
        probe = ["sh", "-c", "[ -t 0 ] && [ -t 1 ] && exit 7; exit 1"]
        r = self.sb.exec(probe, tty=True, size=(100, 30))
        self.assertEqual((r.exit_code, r.stderr), (7, b""))
        self.assertEqual(self.sb.exec(probe).exit_code, 1)
        script = "[ -t 0 ] && [ -t 1 ] && echo ON-A-TERMINAL; read x; exit 5"
        with self.sb.open_exec(["sh", "-c", script], tty=True) as s:
            seen = b""
            while b"ON-A-TERMINAL\r\n" not in seen:
                ev = s.recv()
                self.assertIsNotNone(ev, seen)
                assert ev is not None
                self.assertEqual(ev[0], "stdout")
                seen += ev[1]
            s.write("\n")
            self.assertEqual(s.wait().exit_code, 5)

    def test_tty_session_resizes(self) -> None:
        script = 'while read line; do [ "$line" = q ] && exit 3; stty size; done'
        with self.sb.open_exec(["sh", "-c", script], tty=True, size=(100, 30), timeout=120) as s:
            seen = see_size(s, b"30 100")
            s.resize(120, 40)
            seen += see_size(s, b"40 120")
            s.write("q\n")
            r = s.wait()
        self.assertEqual(r.exit_code, 3)
        self.assertIn(b"40 120", seen)

    def test_session_stdin_and_streams(self) -> None:
        with self.sb.open_exec(["sh", "-c", "read x; echo got $x; echo err >&2; exit 4"], stdin=True) as s:
            s.write(b"hi\n")
            chunks = list(s)
            r = s.wait()
        self.assertEqual(b"".join(d for n, d in chunks if n == "stdout"), b"got hi\n")
        self.assertEqual(b"".join(d for n, d in chunks if n == "stderr"), b"err\n")
        self.assertEqual(r.exit_code, 4)
        # A resize without a tty breaks the protocol: the server ends the
        # session with invalid_frame.
        with self.sb.open_exec(["sleep", "5"], stdin=True) as s:
            s.resize(80, 24)
            with self.assertRaises(hiloop.InvalidRequestError) as e:
                s.wait()
        self.assertEqual(e.exception.code, "invalid_frame")

    def test_run_exit_codes(self) -> None:
        r = self.sb.run("echo out; echo err >&2")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.timed_out), (0, b"out\n", b"err\n", False))
        self.assertEqual(self.sb.run(["sh", "-c", "exit 3"]).exit_code, 3)
        r = self.sb.run("kill -9 $$")
        self.assertEqual((r.exit_code, r.signal, r.timed_out), (137, "killed", False))
        r = self.sb.run(["sleep", "30"], timeout=1)
        self.assertTrue(r.timed_out)
        self.assertIsNone(r.exit_code)
        # head -c: not every cluster delivers stdin's end to a command.
        self.assertEqual(self.sb.run(["head", "-c", "4"], stdin="fed\n").stdout, b"fed\n")

    def test_run_output_not_utf8(self) -> None:
        # Output that is not UTF-8 comes back byte for byte; a byte that is
        # not UTF-8 in stderr alone leaves stdout's text as it was.
        r = self.sb.run(["printf", "\\377\\000a"])
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, b"\xff\x00a", b""))
        r = self.sb.run(["sh", "-c", "printf 'h\\303\\251llo'; printf '\\376' >&2"])
        self.assertEqual((r.stdout, r.stderr), ("h\u00e9llo".encode(), b"\xfe"))

    def test_exec_streaming(self) -> None:
        chunks: List[bytes] = []
        r = self.sb.exec("for i in 1 2 3; do echo $i; done; echo e >&2; exit 3", on_stdout=chunks.append)
        self.assertEqual((r.exit_code, b"".join(chunks), r.stderr), (3, b"1\n2\n3\n", b"e\n"))
        r = self.sb.exec(["sh", "-c", "kill -9 $$"])
        self.assertEqual((r.exit_code, r.signal), (137, "killed"))
        r = self.sb.exec(["sleep", "30"], timeout=1)
        self.assertTrue(r.timed_out)
        with self.assertRaises(hiloop.LimitError) as e:
            self.sb.exec(["head", "-c", "300000", "/dev/zero"], max_output=100000)
        self.assertEqual(e.exception.code, "output_limit")
        r = self.sb.exec(["head", "-c", "300000", "/dev/zero"], max_output=300000)
        self.assertEqual((r.exit_code, len(r.stdout)), (0, 300000))

    def test_file_100mib(self) -> None:
        size = 100 << 20
        with tempfile.TemporaryFile() as f:
            want = hashlib.sha256()
            for _ in range(size // (1 << 20)):
                block = os.urandom(1 << 20)
                want.update(block)
                f.write(block)
            f.seek(0)
            info = self.sb.files.write(self.work + "/big.bin", f)
        self.assertEqual((info["size"], info["sha256"]), (size, want.hexdigest()))
        got = hashlib.sha256()

        class Hasher:
            def write(self, b: bytes) -> None:
                got.update(b)
        n = self.sb.files.read_to(self.work + "/big.bin", Hasher())  # type: ignore[arg-type]
        self.assertEqual((n, got.hexdigest()), (size, want.hexdigest()))

    def test_small_file_and_mode(self) -> None:
        self.sb.files.write(self.work + "/s/hello.py", "print('hi')\n", mode=0o750)
        self.assertEqual(self.sb.files.read(self.work + "/s/hello.py"), b"print('hi')\n")
        self.assertEqual(self.sb.run(["sh", "-c", "ls -l " + self.work + "/s/hello.py | cut -c1-10"]).stdout, b"-rwxr-x---\n")
        with self.assertRaises(hiloop.NotFoundError) as e:
            self.sb.files.read(self.work + "/nothing")
        self.assertEqual(e.exception.code, "file_not_found")

    def test_hostile_paths(self) -> None:
        for bad in ["relative/x", self.work + "/../x", self.work + "/a\nb", self.work + "/a\x00b", "/" + "a" * 5000]:
            with self.assertRaises(hiloop.InvalidRequestError) as e:
                self.sb.files.write(bad, b"x")
            self.assertEqual(e.exception.code, "invalid_path")
        canary = self.work + "/pwned"
        for name in ["$(touch %s)" % canary, "`touch %s`" % canary, "it's \"q\"", "-rf"]:
            self.sb.files.write(self.work + "/h/" + name, name)
            self.assertEqual(self.sb.files.read(self.work + "/h/" + name), name.encode())
        self.assertNotEqual(self.sb.run(["test", "-e", canary]).exit_code, 0)

    def test_directory(self) -> None:
        local = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, local)
        files = {"a.txt": b"a", "sub/b.txt": b"bee", "sub/deeper/c.py": b"print(1)\n"}
        for name, content in files.items():
            os.makedirs(os.path.join(local, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(local, name), "wb") as f:
                f.write(content)
        self.sb.files.upload_dir(local, self.work + "/tree")
        base = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, base)
        back = os.path.join(base, "back")
        self.sb.files.download_dir(self.work + "/tree", back)
        for name, content in files.items():
            with open(os.path.join(back, name), "rb") as f:
                self.assertEqual(f.read(), content)
        self.assertEqual(os.listdir(base), ["back"])
        with self.assertRaises(FileExistsError):
            self.sb.files.download_dir(self.work + "/tree", back)
        with open(os.path.join(back, "a.txt"), "wb") as f:
            f.write(b"local")
        with open(os.path.join(back, "mine.txt"), "wb") as f:
            f.write(b"mine")
        self.sb.files.download_dir(self.work + "/tree", back, overwrite=True)
        for name, content in dict(files, **{"mine.txt": b"mine"}).items():
            with open(os.path.join(back, name), "rb") as f:
                self.assertEqual(f.read(), content)
        with self.assertRaises(hiloop.LimitError) as e:
            self.sb.files.download_dir(self.work + "/tree", os.path.join(base, "small"), max_bytes=5)
        self.assertEqual(e.exception.code, "extract_limit")
        self.assertEqual(os.listdir(base), ["back"])

    def test_cut_upload_keeps_old_file(self) -> None:
        p = self.work + "/keep.txt"
        old = b"old " * 1000
        self.sb.files.write(p, old)
        u = urlsplit(self.client.url)
        s = socket.create_connection((u.hostname, u.port))
        s.sendall(("PUT /v1/sandboxes/%s/files?path=%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                   "Content-Length: 2000000\r\n\r\n" % (self.sb.id, p, self.client.token)).encode())
        s.sendall(b"new " * 250000)
        time.sleep(0.5)
        s.close()
        deadline = time.monotonic() + 20
        while b".hiloop-" in self.sb.run(["ls", "-a", self.work]).stdout:
            self.assertLess(time.monotonic(), deadline, "the cut upload's temporary file lingers")
            time.sleep(0.2)
        self.assertEqual(self.sb.files.read(p), old)

    def test_other_organization(self) -> None:
        token_b = os.environ.get("HILOOP_TEST_TOKEN_B")
        if not token_b:
            self.skipTest("no HILOOP_TEST_TOKEN_B")
        b = hiloop.Client(token=token_b)
        with b.sandboxes.create("busybox", ttl="1h") as sb_b:
            for who, sid in ((b, self.sb.id), (self.client, sb_b.id)):
                with self.assertRaises(hiloop.NotFoundError):
                    who.sandboxes.get(sid)
                other = hiloop.Sandbox(who, {"id": sid, "state": "running"})
                for call in (lambda: other.run("true"), lambda: other.files.read("/etc/hostname"),
                             lambda: other.files.write(self.work + "/x", b"x"), lambda: other.exec("true"),
                             lambda: other.update(ttl="2h"), lambda: other.set_ttl("5m"),
                             lambda: other.update(idle_timeout="0"), lambda: other.touch(), other.refresh,
                             other.events, lambda: other.open_exec(["sh"], tty=True).close(),
                             lambda: other.exec("true", tty=True, stdin=b"x")):
                    with self.assertRaises(hiloop.NotFoundError) as e:
                        call()
                    self.assertEqual(e.exception.code, "not_found")
                    self.assertTrue(e.exception.request_id)

    def test_context_manager_deletes(self) -> None:
        with self.client.sandboxes.create("busybox", ttl="1h") as sb:
            self.assertEqual(sb.run("true").exit_code, 0)
        self.assertEqual(self.client.sandboxes.get(sb.id).data["desired"], "deleted")
        sb2 = self.client.sandboxes.get(sb.id).wait("deleted", timeout=60)
        self.assertEqual(sb2.state, "deleted")

    def test_stop_start(self) -> None:
        with self.client.sandboxes.create("busybox", ttl="1h") as sb:
            sb.stop()
            sb.wait("stopped", timeout=120)
            with self.assertRaises(hiloop.ConflictError) as e:
                sb.run("true")
            self.assertEqual(e.exception.code, "sandbox_not_running")
            sb.start()
            sb.wait("running", timeout=120)
            self.assertEqual(sb.run("true").exit_code, 0)


async def see_size_aio(s: aio.ExecSession, size: bytes) -> bytes:
    """see_size over the asyncio client."""
    seen = b""
    for _ in range(100):
        await s.write("\n")
        ev = await s.recv()
        while ev is not None and b"\n" not in ev[1]:
            seen += ev[1]
            ev = await s.recv()
        if ev is None:
            raise AssertionError("the session ended early: %r" % seen)
        seen += ev[1]
        if size in seen:
            return seen
    raise AssertionError("no %r in %r" % (size, seen))


@unittest.skipUnless(LIVE and not os.environ.get("HILOOP_TEST_NO_TAR"), "needs a live hiloop (HILOOP_URL, HILOOP_TOKEN)")
class AioSandboxTest(unittest.IsolatedAsyncioTestCase):
    """hiloop.aio against the live server, on a sandbox the synchronous
    client made (each test has an event loop, and so a client, of its
    own)."""

    sync: hiloop.Client
    sb_id: str
    work: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.sync = hiloop.Client()
        cls.sb_id = cls.sync.sandboxes.create("busybox", ttl="1h", labels={"suite": "python-aio"}).id
        cls.work = workdir()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sync.sandboxes.get(cls.sb_id).delete()
        cls.sync.close()

    async def asyncSetUp(self) -> None:
        self.client = aio.Client()
        self.sb = await self.client.sandboxes.get(self.sb_id)

    async def asyncTearDown(self) -> None:
        await self.client.close()

    async def test_sandbox_calls(self) -> None:
        self.assertEqual((self.sb.state, self.sb.info.image, self.sb.data["desired"]), ("running", "busybox", "running"))
        self.assertEqual((await self.sb.refresh()).state, "running")
        ids = [s.id async for s in self.client.sandboxes.list(labels={"suite": "python-aio"}, limit=1)]
        self.assertEqual(ids, [self.sb_id])
        self.assertIn("running", [e["to"] for e in await self.sb.events()])
        self.assertIn("sessions", await self.client.org())
        asked = datetime.datetime.now(datetime.timezone.utc)
        expires = (await self.sb.set_ttl("3h")).info.expires_at
        assert expires is not None
        self.assertGreaterEqual(expires, asked + datetime.timedelta(hours=3) - datetime.timedelta(seconds=1))
        self.assertEqual((await self.sb.update(idle_timeout=45 * 60)).info.idle_timeout, "45m0s")
        self.assertEqual((await self.sb.update(idle_timeout="0")).info.idle_timeout, "0s")
        before = self.sb.info.last_activity_at
        after = (await self.sb.touch()).info.last_activity_at
        assert before is not None and after is not None
        self.assertGreaterEqual(after, before)
        with self.assertRaises(hiloop.InvalidRequestError) as e:
            await self.sb.update(ttl="forever")
        self.assertEqual((e.exception.code, e.exception.field), ("invalid_field", "ttl"))
        with self.assertRaises(hiloop.InvalidRequestError) as e:
            await self.sb.update()
        self.assertEqual(e.exception.code, "invalid_field")

    async def test_run_and_exec(self) -> None:
        r = await self.sb.run("echo out; echo err >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (3, b"out\n", b"err\n"))
        r = await self.sb.run(["sh", "-c", "printf 'h\\303\\251llo'; printf '\\376' >&2"])
        self.assertEqual((r.stdout, r.stderr), ("h\u00e9llo".encode(), b"\xfe"))
        self.assertTrue((await self.sb.run(["sleep", "30"], timeout=1)).timed_out)
        chunks: List[bytes] = []
        r = await self.sb.exec("for i in 1 2 3; do echo $i; done; echo e >&2; exit 3", on_stdout=chunks.append)
        self.assertEqual((r.exit_code, b"".join(chunks), r.stderr), (3, b"1\n2\n3\n", b"e\n"))
        r = await self.sb.exec(["sh", "-c", "kill -9 $$"])
        self.assertEqual((r.exit_code, r.signal), (137, "killed"))
        self.assertTrue((await self.sb.exec(["sleep", "30"], timeout=1)).timed_out)
        r = await self.sb.exec(["head", "-c", "4"], stdin=b"fed\n")
        self.assertEqual(r.stdout, b"fed\n")
        with self.assertRaises(hiloop.LimitError) as e:
            await self.sb.exec(["head", "-c", "300000", "/dev/zero"], max_output=100000)
        self.assertEqual(e.exception.code, "output_limit")
        r = await self.sb.exec(["head", "-c", "300000", "/dev/zero"])
        self.assertEqual((r.exit_code, len(r.stdout)), (0, 300000))

    async def test_tty(self) -> None:
        probe = ["sh", "-c", "[ -t 0 ] && [ -t 1 ] && exit 7; exit 1"]
        r = await self.sb.exec(probe, tty=True)
        self.assertEqual((r.exit_code, r.stderr), (7, b""))
        script = 'while read line; do [ "$line" = q ] && exit 3; stty size; done'
        async with self.sb.open_exec(["sh", "-c", script], tty=True, size=(100, 30), timeout=120) as s:
            await see_size_aio(s, b"30 100")
            await s.resize(120, 40)
            await see_size_aio(s, b"40 120")
            await s.write(b"q\n")
            self.assertEqual((await s.wait()).exit_code, 3)
        async with self.sb.open_exec(["sh", "-c", "read x; echo got $x"], stdin=True) as s:
            await s.write("hi\n")
            got = [d async for n, d in s if n == "stdout"]
            self.assertEqual(((await s.wait()).exit_code, b"".join(got)), (0, b"got hi\n"))

    async def test_files(self) -> None:
        p = self.work + "/aio/f.bin"
        data = os.urandom(3 << 20)
        info = await self.sb.files.write(p, io.BytesIO(data))
        self.assertEqual((info["size"], info["sha256"]), (len(data), hashlib.sha256(data).hexdigest()))
        self.assertEqual(await self.sb.files.read(p), data)
        out = io.BytesIO()
        self.assertEqual(await self.sb.files.read_to(p, out), len(data))
        self.assertEqual(out.getvalue(), data)
        await self.sb.files.write(self.work + "/aio/t.txt", "text", mode=0o600)
        self.assertEqual(await self.sb.files.read(self.work + "/aio/t.txt"), b"text")
        with self.assertRaises(hiloop.NotFoundError) as e:
            await self.sb.files.read(self.work + "/nothing")
        self.assertEqual(e.exception.code, "file_not_found")
        with self.assertRaises(hiloop.InvalidRequestError) as e:
            await self.sb.files.write("relative", b"x")
        self.assertEqual(e.exception.code, "invalid_path")
        local = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, local)
        os.makedirs(os.path.join(local, "up", "sub"))
        with open(os.path.join(local, "up", "sub", "b.txt"), "wb") as f:
            f.write(b"bee")
        await self.sb.files.upload_dir(os.path.join(local, "up"), self.work + "/aio/tree")
        await self.sb.files.download_dir(self.work + "/aio/tree", os.path.join(local, "down"))
        with open(os.path.join(local, "down", "sub", "b.txt"), "rb") as f:
            self.assertEqual(f.read(), b"bee")
        with self.assertRaises(FileExistsError):
            await self.sb.files.download_dir(self.work + "/aio/tree", os.path.join(local, "down"))
        with self.assertRaises(hiloop.LimitError) as e:
            await self.sb.files.download_dir(self.work + "/aio/tree", os.path.join(local, "small"), max_bytes=1)
        self.assertEqual(e.exception.code, "extract_limit")
        self.assertEqual(sorted(os.listdir(local)), ["down", "up"])

    async def test_create_deletes_on_exit(self) -> None:
        async with self.client.sandboxes.create("busybox", ttl="1h", idle_timeout="1h") as sb:
            self.assertEqual((sb.state, sb.info.idle_timeout), ("running", "1h0m0s"))
            self.assertEqual((await sb.run("true")).exit_code, 0)
        self.assertEqual((await self.client.sandboxes.get(sb.id)).info.desired, "deleted")
        stopped = await self.client.sandboxes.create("busybox", ttl="1h")
        try:
            await stopped.stop()
            await stopped.wait("stopped", timeout=120)
            with self.assertRaises(hiloop.ConflictError) as e:
                await stopped.run("true")
            self.assertEqual(e.exception.code, "sandbox_not_running")
            with self.assertRaises(hiloop.ConflictError) as e:
                await stopped.exec("true")
            self.assertEqual(e.exception.code, "sandbox_not_running")
        finally:
            await stopped.delete()

    async def test_other_organization(self) -> None:
        token_b = os.environ.get("HILOOP_TEST_TOKEN_B")
        if not token_b:
            self.skipTest("no HILOOP_TEST_TOKEN_B")
        b = aio.Client(token=token_b)
        self.addAsyncCleanup(b.close)
        with self.assertRaises(hiloop.NotFoundError):
            await b.sandboxes.get(self.sb_id)
        other = aio.Sandbox(b, {"id": self.sb_id, "state": "running"})

        async def open_tty() -> None:
            async with other.open_exec(["sh"], tty=True):
                pass
        for name, call in (("run", lambda: other.run("true")), ("exec", lambda: other.exec("true")),
                           ("tty", open_tty), ("update", lambda: other.update(ttl="2h")),
                           ("set_ttl", lambda: other.set_ttl(60)), ("touch", other.touch), ("stop", other.stop),
                           ("events", other.events), ("read", lambda: other.files.read("/etc/hostname")),
                           ("write", lambda: other.files.write(self.work + "/x", b"x"))):
            with self.subTest(call=name):
                with self.assertRaises(hiloop.NotFoundError) as e:
                    await call()  # type: ignore[operator]
                self.assertEqual(e.exception.code, "not_found")
                self.assertTrue(e.exception.request_id)
        self.assertEqual(self.sync.sandboxes.get(self.sb_id).state, "running")


@unittest.skipUnless(LIVE and os.environ.get("HILOOP_TEST_NO_TAR"), "needs a live hiloop whose image has no tar")
class NoTarTest(unittest.TestCase):
    def test_directory_refused_file_accepted(self) -> None:
        client = hiloop.Client()
        with client.sandboxes.create("busybox", ttl="1h") as sb:
            work = workdir()
            sb.files.write(work + "/f", b"x")
            local = tempfile.mkdtemp()
            self.addCleanup(shutil.rmtree, local)
            with self.assertRaises(hiloop.UnsupportedError) as e:
                sb.files.upload_dir(local, work + "/d")
            self.assertEqual(e.exception.code, "tar_unavailable")
            with self.assertRaises(hiloop.UnsupportedError) as e:
                sb.files.download_dir(work, os.path.join(local, "d"))
            self.assertEqual(e.exception.code, "tar_unavailable")


class RetryTest(unittest.TestCase):
    """Against a local stand-in server: a create refused 503 and 429 with
    Retry-After is tried again with one Idempotency-Key; a quota (429
    without Retry-After) is not retried and raises QuotaError."""

    def serve(self, answers: List[int]) -> List[str]:
        keys: List[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                keys.append(self.headers.get("Idempotency-Key", ""))
                status = answers[min(len(keys), len(answers)) - 1]
                body = {"id": "sbx_1", "state": "pending"} if status < 400 else \
                    {"error": {"code": "quota_exceeded" if status == 429 and len(answers) == 1 else "storage_unavailable",
                               "message": "no", "request_id": "req_%d" % len(keys)}}
                data = json.dumps(body).encode()
                self.send_response(status)
                if status >= 400 and len(answers) > 1:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        self.url = "http://127.0.0.1:%d" % srv.server_address[1]
        return keys

    def test_create_retries_with_one_key(self) -> None:
        keys = self.serve([503, 429, 201])
        sb = hiloop.Client(self.url, "hl_x").sandboxes.create("busybox", wait=False)
        self.assertEqual(sb.id, "sbx_1")
        self.assertEqual(len(keys), 3)
        self.assertTrue(keys[0])
        self.assertEqual(len(set(keys)), 1)

    def test_quota_not_retried(self) -> None:
        keys = self.serve([429])
        with self.assertRaises(hiloop.QuotaError) as e:
            hiloop.Client(self.url, "hl_x").sandboxes.create("busybox", wait=False)
        self.assertEqual((e.exception.code, e.exception.request_id, len(keys)), ("quota_exceeded", "req_1", 1))

    def test_refuses_plain_http_elsewhere(self) -> None:
        with self.assertRaises(ValueError):
            hiloop.Client("http://10.1.2.3:8080", "hl_x")
        with self.assertRaises(ValueError):
            hiloop.Client("http://127.attacker.example", "hl_x")


if __name__ == "__main__":
    unittest.main()
