"""File operations, background processes, run and exec's env and cwd,
and previews, with both clients, against a live hiloop (as test_sdk;
HILOOP_TEST_PREVIEWS says the server has previews on and the forward
transport)."""

import asyncio
import datetime
import os
import re
import unittest
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import hiloop
from hiloop import aio
from test_sdk import LIVE, workdir

# A script that prints, waits for a line on stdin, echoes it and exits 7.
ECHO = ["sh", "-c", "echo hello; read x; echo got $x; exit 7"]


FULL = LIVE and not os.environ.get("HILOOP_TEST_NO_TAR")
PREVIEWS = FULL and bool(os.environ.get("HILOOP_TEST_PREVIEWS"))
# A dev server on a free port of the sandbox's loopback, saying which.
DEV_SERVER = ["python3", "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory"]


def other_org() -> str:
    return os.environ.get("HILOOP_TEST_TOKEN_B", "")


def listening_port(sb: hiloop.Sandbox, pid: str) -> int:
    """The port the dev server pid says it listens on, reading its
    output until it does."""
    log = b""
    with sb.processes.output(pid, follow=True) as out:
        for chunk in out:
            log += chunk
            m = re.search(rb"Serving HTTP on \S+ port (\d+)", log)
            if m:
                return int(m.group(1))
    raise AssertionError("the dev server ended: %r" % log)


def visit(url: str, headers: Optional[Dict[str, str]] = None) -> Tuple[int, bytes]:
    """The status and body of a GET of url, an error status included."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@unittest.skipUnless(FULL, "needs a live hiloop (HILOOP_URL, HILOOP_TOKEN)")
class FSProcessTest(unittest.TestCase):
    client: hiloop.Client
    sb: hiloop.Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = hiloop.Client()
        cls.sb = cls.client.sandboxes.create("busybox", ttl="1h", env={"GREETING": "hi there"})

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.delete()
        cls.client.close()

    def assertRefused(self, cls: Type[hiloop.HiloopError], code: str, call: Callable[[], Any], field: str = "") -> None:
        with self.assertRaises(cls) as e:
            call()
        self.assertEqual(e.exception.code, code)
        if field:
            self.assertEqual(e.exception.field, field)

    def test_files(self) -> None:
        work, fs = workdir(), self.sb.files
        d = fs.mkdir(work + "/a/b")
        self.assertEqual((d.type, d.path, d.name, d.is_dir), ("dir", work + "/a/b", "b", True))
        self.assertEqual(fs.mkdir(work + "/a/b").type, "dir")  # one that exists is no error
        odd = "-odd 'name' \"q\" $(x) é"
        fs.write(work + "/a/" + odd, b"12345", mode=0o600)
        fs.write(work + "/a/x.txt", "x")
        listing = fs.list(work + "/a")
        self.assertIsInstance(listing, hiloop.FileList)
        self.assertEqual(([e.name for e in listing], listing.truncated), ([odd, "b", "x.txt"], False))
        e = fs.stat(work + "/a/" + odd)
        self.assertEqual((e.type, e.size, e.mode, e.path), ("file", 5, 0o600, work + "/a/" + odd))
        assert e.mtime is not None
        self.assertIsNotNone(e.mtime.tzinfo)
        now = datetime.datetime.now(datetime.timezone.utc)
        self.assertLess(abs((now - e.mtime).total_seconds()), 3600)
        self.assertTrue(fs.exists(work + "/a/x.txt"))
        self.assertFalse(fs.exists(work + "/nothing"))

        moved = fs.rename(work + "/a/x.txt", work + "/c/y.txt")
        self.assertEqual((moved.path, moved.size), (work + "/c/y.txt", 1))
        self.assertFalse(fs.exists(work + "/a/x.txt"))
        fs.write(work + "/z.txt", "zz")
        self.assertRefused(hiloop.ConflictError, "path_conflict", lambda: fs.rename(work + "/z.txt", work + "/c/y.txt"))
        self.assertEqual(fs.rename(work + "/z.txt", work + "/c/y.txt", overwrite=True).size, 2)
        self.assertEqual(fs.read(work + "/c/y.txt"), b"zz")

        self.assertRefused(hiloop.ConflictError, "directory_not_empty", lambda: fs.remove(work + "/a"))
        self.assertTrue(fs.exists(work + "/a/b"))
        fs.remove(work + "/c/y.txt")
        fs.remove(work + "/c")
        fs.remove(work, recursive=True)
        self.assertFalse(fs.exists(work))

        self.assertRefused(hiloop.NotFoundError, "file_not_found", lambda: fs.stat(work))
        self.assertRefused(hiloop.NotFoundError, "file_not_found", lambda: fs.list(work))
        self.assertRefused(hiloop.NotFoundError, "file_not_found", lambda: fs.remove(work))
        self.assertRefused(hiloop.ConflictError, "path_conflict", lambda: fs.list("/etc/hostname"))
        self.assertRefused(hiloop.InvalidRequestError, "invalid_path", lambda: fs.stat("relative"), "path")
        self.assertRefused(hiloop.InvalidRequestError, "invalid_path", lambda: fs.remove("/", recursive=True))
        self.assertRefused(hiloop.InvalidRequestError, "invalid_path", lambda: fs.rename("/tmp", "rel"), "to")

    def test_process_lifecycle(self) -> None:
        ps = self.sb.processes
        p = ps.start(ECHO)
        self.assertIsInstance(p, hiloop.Process)
        self.assertEqual((p.state, p.command, p.sandbox_id, p.running), ("running", ECHO, self.sb.id, True))
        self.assertIsNotNone(p.started_at and p.started_at.tzinfo)
        self.assertIn(p.id, [q.id for q in ps.list()])
        self.assertEqual(ps.get(p.id).id, p.id)
        # Follow until the first line shows, then feed the line it reads.
        with ps.output(p.id, follow=True) as out:
            self.assertEqual(out.offset, 0)
            seen = b""
            while b"hello\n" not in seen:
                chunk = out.read()
                self.assertTrue(chunk, seen)
                seen += chunk
        ps.write_stdin(p.id, "hi\n", close=True)
        chunks: List[bytes] = []
        done = ps.attach(p.id, chunks.append)
        self.assertEqual((done.state, done.exit_code, b"".join(chunks)), ("exited", 7, b"hello\ngot hi\n"))
        self.assertIsNotNone(done.ended_at)
        self.assertEqual(ps.wait(p.id).exit_code, 7)
        # From an offset, without follow: what is there, and where it began.
        with ps.output(p.id, offset=6) as out:
            self.assertEqual((out.offset, b"".join(out), out.offset), (6, b"got hi\n", 13))
        self.assertEqual(ps.attach(p.id, chunks.append, offset=13).exit_code, 7)
        self.assertRefused(hiloop.ConflictError, "process_not_running", lambda: ps.write_stdin(p.id, "x"))
        # env and cwd reach the process exactly; a cwd the sandbox lacks is file_not_found.
        envd: List[bytes] = []
        q = ps.start(["sh", "-c", 'pwd; printf %s "$V"'], env={"V": "a 'b' $(c)\n"}, cwd="/tmp")
        self.assertEqual((ps.attach(q.id, envd.append).exit_code, b"".join(envd)), (0, b"/tmp\na 'b' $(c)\n"))
        self.assertRefused(hiloop.NotFoundError, "file_not_found", lambda: ps.start(["true"], cwd="/nonexistent"))

    def test_process_signals(self) -> None:
        ps = self.sb.processes
        term = ps.start(["sleep", "300"])
        self.assertEqual(ps.signal(term.id, "SIGTERM").id, term.id)
        self.assertEqual(ps.wait(term.id).exit_code, 143)
        killed = ps.start("sleep 300")
        self.assertEqual(ps.kill(killed.id).id, killed.id)
        self.assertEqual((ps.wait(killed.id).exit_code, ps.get(killed.id).state), (137, "exited"))
        closed = ps.start(["sh", "-c", "cat >/dev/null; exit 3"])
        ps.close_stdin(closed.id)
        self.assertEqual(ps.wait(closed.id).exit_code, 3)
        self.assertRefused(hiloop.InvalidRequestError, "invalid_field", lambda: ps.signal(term.id, "BOGUS"), "signal")
        self.assertRefused(hiloop.NotFoundError, "not_found", lambda: ps.get("proc_nothing"))
        self.assertRefused(hiloop.NotFoundError, "not_found", lambda: ps.kill("proc_nothing"))
        with self.assertRaises(ValueError):
            ps.write_stdin(term.id, b"x" * ((64 << 10) + 1))

    def test_output_gone(self) -> None:
        ps = self.sb.processes
        big = ps.start(["head", "-c", "12000000", "/dev/zero"])
        self.assertEqual(ps.wait(big.id).exit_code, 0)
        with self.assertRaises(hiloop.HiloopError) as e:
            ps.output(big.id, offset=0)
        self.assertEqual((e.exception.code, e.exception.status), ("output_gone", 410))
        # What is kept still reads, from the newest offsets.
        with ps.output(big.id, offset=12000000 - 10) as out:
            self.assertEqual(b"".join(out), b"\0" * 10)

    def test_env_cwd_and_bytes(self) -> None:
        weird = 'a "b" $(c) \n\u00e9'
        r = self.sb.run(["sh", "-c", 'printf "%s|" "$W"; pwd'], env={"W": weird}, cwd="/etc")
        self.assertEqual((r.exit_code, r.stdout, r.encoding), (0, (weird + "|/etc\n").encode(), "utf-8"))
        r = self.sb.run(["printf", "\\377\\000x"])
        self.assertEqual((r.stdout, r.encoding), (b"\xff\x00x", "base64"))
        r = self.sb.exec(["sh", "-c", 'echo "$W"; pwd'], env={"W": "w"}, cwd="/tmp")
        self.assertEqual((r.exit_code, r.stdout), (0, b"w\n/tmp\n"))
        with self.sb.open_exec(["sh", "-c", 'read x; echo "$W$x"; pwd'], stdin=True, env={"W": "v"}, cwd="/") as s:
            s.write("!\n")
            self.assertEqual(s.wait().stdout, b"v!\n/\n")
        self.assertEqual(self.sb.refresh().info.env, {"GREETING": "hi there"})
        for call in (lambda: self.sb.run("true", cwd="/nowhere"), lambda: self.sb.exec("true", cwd="/nowhere")):
            self.assertRefused(hiloop.NotFoundError, "file_not_found", call, "cwd")
        self.assertRefused(hiloop.ConflictError, "path_conflict", lambda: self.sb.run("true", cwd="/etc/hostname"))
        self.assertRefused(hiloop.InvalidRequestError, "invalid_env", lambda: self.sb.run("true", env={"HILOOP_X": "1"}))
        self.assertRefused(hiloop.InvalidRequestError, "invalid_path", lambda: self.sb.run("true", cwd="rel"), "cwd")

    def test_other_organization(self) -> None:
        token_b = other_org()
        if not token_b:
            self.skipTest("no HILOOP_TEST_TOKEN_B")
        p = self.sb.processes.start(["sleep", "300"])
        self.addCleanup(self.sb.processes.kill, p.id)
        b = hiloop.Client(token=token_b)
        self.addCleanup(b.close)
        other = hiloop.Sandbox(b, {"id": self.sb.id, "state": "running"})
        fs, ps = other.files, other.processes
        calls: List[Tuple[str, Callable[[], Any]]] = [
            ("list", lambda: fs.list("/")), ("stat", lambda: fs.stat("/etc")), ("exists", lambda: fs.exists("/etc")),
            ("remove", lambda: fs.remove("/tmp/x")), ("mkdir", lambda: fs.mkdir("/tmp/x")),
            ("rename", lambda: fs.rename("/tmp/x", "/tmp/y")), ("start", lambda: ps.start("true")),
            ("processes", ps.list), ("get", lambda: ps.get(p.id)), ("kill", lambda: ps.kill(p.id)),
            ("signal", lambda: ps.signal(p.id, "TERM")), ("stdin", lambda: ps.write_stdin(p.id, "x")),
            ("output", lambda: ps.output(p.id)), ("wait", lambda: ps.wait(p.id)),
            ("run env", lambda: other.run("true", env={"A": "b"}, cwd="/"))]
        for name, call in calls:
            with self.subTest(call=name):
                self.assertRefused(hiloop.NotFoundError, "not_found", call)
        self.assertTrue(self.sb.processes.get(p.id).running)


@unittest.skipUnless(FULL, "needs a live hiloop (HILOOP_URL, HILOOP_TOKEN)")
class AioFSProcessTest(unittest.IsolatedAsyncioTestCase):
    sync: hiloop.Client
    sb_id: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.sync = hiloop.Client()
        cls.sb_id = cls.sync.sandboxes.create("busybox", ttl="1h").id

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sync.sandboxes.get(cls.sb_id).delete()
        cls.sync.close()

    async def asyncSetUp(self) -> None:
        self.client = aio.Client()
        self.sb = await self.client.sandboxes.get(self.sb_id)

    async def asyncTearDown(self) -> None:
        await self.client.close()

    async def assertRefused(self, cls: Type[hiloop.HiloopError], code: str, call: Callable[[], Any]) -> None:
        with self.assertRaises(cls) as e:
            await call()
        self.assertEqual(e.exception.code, code)

    async def test_files(self) -> None:
        work, fs = workdir(), self.sb.files
        self.assertEqual((await fs.mkdir(work + "/d")).type, "dir")
        await fs.write(work + "/d/f", b"abc")
        self.assertEqual([e.name for e in (await fs.list(work + "/d")).entries], ["f"])
        self.assertEqual((await fs.stat(work + "/d/f")).size, 3)
        self.assertTrue(await fs.exists(work + "/d/f"))
        self.assertEqual((await fs.rename(work + "/d/f", work + "/g")).path, work + "/g")
        self.assertFalse(await fs.exists(work + "/d/f"))
        await self.assertRefused(hiloop.ConflictError, "directory_not_empty", lambda: fs.remove(work))
        await fs.remove(work, recursive=True)
        await self.assertRefused(hiloop.NotFoundError, "file_not_found", lambda: fs.stat(work))

    async def test_processes(self) -> None:
        ps = self.sb.processes
        p = await ps.start(ECHO)
        self.assertTrue(p.running)
        self.assertIn(p.id, [q.id for q in await ps.list()])
        async with await ps.output(p.id, follow=True) as out:
            seen = b""
            while b"hello\n" not in seen:
                chunk = await out.read()
                self.assertTrue(chunk, seen)
                seen += chunk
        await ps.write_stdin(p.id, b"hi\n", close=True)
        chunks: List[bytes] = []

        async def take(b: bytes) -> None:
            chunks.append(b)
        done = await ps.attach(p.id, take)
        self.assertEqual((done.exit_code, b"".join(chunks)), (7, b"hello\ngot hi\n"))
        async with await ps.output(p.id, offset=6) as out:
            self.assertEqual(b"".join([c async for c in out]), b"got hi\n")
        self.assertEqual((await ps.wait(p.id)).exit_code, 7)
        s = await ps.start(["sleep", "300"])
        await ps.signal(s.id, "USR1")
        self.assertEqual((await ps.wait(s.id)).exit_code, 138)
        k = await ps.start(["sleep", "300"])
        await ps.kill(k.id)
        self.assertEqual((await ps.wait(k.id)).exit_code, 137)
        c = await ps.start(["sh", "-c", "cat >/dev/null; exit 3"])
        await ps.close_stdin(c.id)
        self.assertEqual((await ps.wait(c.id)).exit_code, 3)
        await self.assertRefused(hiloop.NotFoundError, "not_found", lambda: ps.get("proc_nothing"))

    async def test_env_cwd_and_bytes(self) -> None:
        r = await self.sb.run(["sh", "-c", 'echo "$W"; pwd'], env={"W": "$(x)"}, cwd="/etc")
        self.assertEqual(r.stdout, b"$(x)\n/etc\n")
        self.assertEqual((await self.sb.run(["printf", "\\377"])).stdout, b"\xff")
        r = await self.sb.exec(["sh", "-c", 'echo "$W"; pwd'], env={"W": "w"}, cwd="/tmp")
        self.assertEqual(r.stdout, b"w\n/tmp\n")
        await self.assertRefused(hiloop.NotFoundError, "file_not_found", lambda: self.sb.exec("true", cwd="/nowhere"))
        await self.assertRefused(hiloop.InvalidRequestError, "invalid_env",
                                 lambda: self.sb.run("true", env={"1X": "y"}))
        # The local cluster's commands run on its own machine, so a
        # create's env reaches commands only on a real node; the record
        # keeps it.
        async with self.client.sandboxes.create("busybox", ttl="1h", env={"E": "from create"}) as sb:
            self.assertEqual((await sb.refresh()).info.env, {"E": "from create"})

    async def test_other_organization(self) -> None:
        token_b = other_org()
        if not token_b:
            self.skipTest("no HILOOP_TEST_TOKEN_B")
        p = await self.sb.processes.start(["sleep", "300"])
        b = aio.Client(token=token_b)
        self.addAsyncCleanup(b.close)
        other = aio.Sandbox(b, {"id": self.sb_id, "state": "running"})
        fs, ps = other.files, other.processes
        for name, call in (("list", lambda: fs.list("/")), ("stat", lambda: fs.stat("/")),
                           ("exists", lambda: fs.exists("/")), ("remove", lambda: fs.remove("/tmp/x")),
                           ("mkdir", lambda: fs.mkdir("/tmp/x")), ("rename", lambda: fs.rename("/tmp/x", "/tmp/y")),
                           ("start", lambda: ps.start("true")), ("processes", ps.list),
                           ("get", lambda: ps.get(p.id)), ("kill", lambda: ps.kill(p.id)),
                           ("signal", lambda: ps.signal(p.id, "TERM")), ("stdin", lambda: ps.write_stdin(p.id, "x")),
                           ("output", lambda: ps.output(p.id)), ("wait", lambda: ps.wait(p.id))):
            with self.subTest(call=name):
                await self.assertRefused(hiloop.NotFoundError, "not_found", call)
        self.assertTrue((await self.sb.processes.kill(p.id)).id)


@unittest.skipUnless(PREVIEWS, "needs a live hiloop with previews (HILOOP_TEST_PREVIEWS)")
class PreviewTest(unittest.TestCase):
    client: hiloop.Client
    sb: hiloop.Sandbox
    port: int
    server: hiloop.Process

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = hiloop.Client()
        cls.sb = cls.client.sandboxes.create("busybox", ttl="1h")
        work = workdir()
        cls.sb.files.write(work + "/page.txt", "hello from the sandbox\n")
        cls.server = cls.sb.processes.start(DEV_SERVER + [work])
        cls.port = listening_port(cls.sb, cls.server.id)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.processes.kill(cls.server.id)
        cls.sb.delete()
        cls.client.close()

    def test_token_and_key_previews(self) -> None:
        pv = self.sb.previews.create(self.port, ttl="10m")
        self.assertIsInstance(pv, hiloop.Preview)
        self.assertEqual((pv.port, pv.auth, pv.sandbox_id), (self.port, "token", self.sb.id))
        self.assertTrue(pv.id.startswith("pv_") and pv.token.startswith("hlp_"), pv)
        self.assertTrue(pv.url.startswith("http://pv-") and "hiloop_preview_token=" + pv.token in pv.url, pv.url)
        self.assertNotIn(pv.token, repr(pv))
        assert pv.expires_at is not None and pv.created_at is not None
        self.assertEqual(round((pv.expires_at - pv.created_at).total_seconds()), 600)
        base = pv.url.split("?")[0]
        self.assertEqual(visit(base + "page.txt", {"Authorization": "Bearer " + pv.token}),
                         (200, b"hello from the sandbox\n"))
        self.assertEqual(visit(base + "page.txt")[0], 404)
        self.assertEqual(visit(base + "page.txt", {"Authorization": "Bearer " + self.client.token})[0], 404)

        key = self.sb.previews.create(self.port, auth="key")
        self.assertEqual((key.auth, key.token), ("key", ""))
        self.assertEqual(visit(key.url + "page.txt", {"Authorization": "Bearer " + self.client.token})[0], 200)
        self.assertEqual(visit(key.url + "page.txt", {"Authorization": "Bearer " + pv.token})[0], 404)

        listed = {p.id: p for p in self.sb.previews.list()}
        self.assertIn(pv.id, listed)
        self.assertIn(key.id, listed)
        self.assertEqual(listed[pv.id].token, "")
        self.assertNotIn("hiloop_preview_token", listed[pv.id].url)
        self.sb.previews.revoke(pv.id)
        self.assertEqual(visit(base + "page.txt", {"Authorization": "Bearer " + pv.token})[0], 404)
        self.assertNotIn(pv.id, [p.id for p in self.sb.previews.list()])
        self.sb.previews.revoke(key.id)

    def test_refusals(self) -> None:
        pvs = self.sb.previews
        for kw, fld in (({"port": 0}, "port"), ({"port": 70000}, "port"), ({"port": 80, "auth": "nobody"}, "auth"),
                        ({"port": 80, "ttl": "forever"}, "ttl"), ({"port": 80, "ttl": "1000h"}, "ttl")):
            with self.subTest(kw=kw):
                with self.assertRaises(hiloop.InvalidRequestError) as e:
                    pvs.create(**kw)  # type: ignore[arg-type]
                self.assertEqual((e.exception.code, e.exception.field), ("invalid_field", fld))
        with self.assertRaises(TypeError):
            pvs.create(True)
        with self.assertRaises(hiloop.NotFoundError) as nf:
            pvs.revoke("pv_nothing")
        self.assertEqual(nf.exception.code, "not_found")

    def test_other_organization(self) -> None:
        token_b = other_org()
        if not token_b:
            self.skipTest("no HILOOP_TEST_TOKEN_B")
        pv = self.sb.previews.create(self.port, auth="key")
        self.addCleanup(self.sb.previews.revoke, pv.id)
        b = hiloop.Client(token=token_b)
        self.addCleanup(b.close)
        other = hiloop.Sandbox(b, {"id": self.sb.id, "state": "running"})
        for name, call in (("create", lambda: other.previews.create(self.port)), ("list", other.previews.list),
                           ("revoke", lambda: other.previews.revoke(pv.id))):
            with self.subTest(call=name):
                with self.assertRaises(hiloop.NotFoundError) as e:
                    call()  # type: ignore[no-untyped-call]
                self.assertEqual(e.exception.code, "not_found")
        self.assertEqual(visit(pv.url + "page.txt", {"Authorization": "Bearer " + token_b})[0], 404)
        self.assertIn(pv.id, [p.id for p in self.sb.previews.list()])


@unittest.skipUnless(PREVIEWS, "needs a live hiloop with previews (HILOOP_TEST_PREVIEWS)")
class AioPreviewTest(unittest.IsolatedAsyncioTestCase):
    async def test_previews(self) -> None:
        async with aio.Client() as client:
            async with client.sandboxes.create("busybox", ttl="1h") as sb:
                work = workdir()
                await sb.files.write(work + "/page.txt", "async page")
                server = await sb.processes.start(DEV_SERVER + [work])
                sync = hiloop.Client()
                self.addCleanup(sync.close)
                port = await asyncio.get_running_loop().run_in_executor(
                    None, listening_port, sync.sandboxes.get(sb.id), server.id)
                pv = await sb.previews.create(port, ttl=datetime.timedelta(minutes=5))
                got = await asyncio.get_running_loop().run_in_executor(
                    None, visit, pv.url.split("?")[0] + "page.txt", {"Authorization": "Bearer " + pv.token})
                self.assertEqual(got, (200, b"async page"))
                self.assertEqual([p.id for p in await sb.previews.list()], [pv.id])
                await sb.previews.revoke(pv.id)
                self.assertEqual(await sb.previews.list(), [])
                with self.assertRaises(hiloop.InvalidRequestError):
                    await sb.previews.create(0)
                await sb.processes.kill(server.id)
                self.assertEqual((await sb.processes.wait(server.id)).exit_code, 137)
