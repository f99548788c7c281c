"""The Python SDK against a live hiloop (HILOOP_URL, HILOOP_TOKEN), as
`make test` runs it (e2e's TestPythonSDK). HILOOP_TEST_TOKEN_B is another
organization's key on the same server; HILOOP_TEST_NO_TAR says the
sandboxes' image has no tar."""

import hashlib
import http.server
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

LIVE = bool(os.environ.get("HILOOP_URL") and os.environ.get("HILOOP_TOKEN"))


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
                             lambda: other.files.write(self.work + "/x", b"x"), lambda: other.exec("true")):
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
