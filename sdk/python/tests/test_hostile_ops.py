"""File operations, processes, previews and run output against a
stand-in server (test_hostile's Stand): answers that are not what a call
answers are refused, and a process's output cut midway is attached again
from the next offset, every byte handed on once."""

import asyncio
import base64
import http.server
import json
import os
import unittest
from typing import Any, List
from unittest import mock

import hiloop
from hiloop import _core
from test_hostile import Stand, answer

RUNNING = {"id": "proc_1", "sandbox_id": "sbx_1", "command": ["sh"], "state": "running", "output_bytes": 0}
EXITED = dict(RUNNING, state="exited", exit_code=5, ended_at="2026-12-06T05:45:29Z")


def send_json(h: http.server.BaseHTTPRequestHandler, status: int, v: Any) -> None:
    answer(h, status, json.dumps(v).encode(), "application/json")


def chunked(h: http.server.BaseHTTPRequestHandler, offset: int, data: bytes, whole: bool) -> None:
    """An output body from offset: data in one chunk, then its end (whole)
    or a closed connection (a cut)."""
    h.send_response(200)
    h.send_header("Content-Type", "application/octet-stream")
    h.send_header("Hiloop-Output-Offset", str(offset))
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    if data:
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    if whole:
        h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()
    h.close_connection = True


class CutOutput:
    """A process whose output ("abcdef") is cut after "abc" once; the
    process has exited by the time the second attach ends."""

    def __init__(self) -> None:
        self.offsets: List[str] = []
        self.ended = False

    def __call__(self, method: str, h: http.server.BaseHTTPRequestHandler) -> None:
        if "/output?" in h.path:
            offset = h.path.split("offset=")[1].split("&")[0]
            self.offsets.append(offset)
            if offset == "0":
                chunked(h, 0, b"abc", whole=False)
            else:
                self.ended = True
                chunked(h, int(offset), b"abcdef"[int(offset):], whole=True)
            return
        send_json(h, 200, EXITED if self.ended else RUNNING)


class ProcessOutputTest(unittest.TestCase):
    def setUp(self) -> None:
        patcher = mock.patch.object(_core, "REATTACH_PAUSE", 0.0)
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_attach_after_a_cut(self) -> None:
        srv = CutOutput()
        stand = Stand(self, srv)
        got: List[bytes] = []
        p = stand.sandbox.processes.attach("proc_1", got.append)
        self.assertEqual((b"".join(got), srv.offsets, p.exit_code, p.state), (b"abcdef", ["0", "3"], 5, "exited"))
        self.assertIsNotNone(p.ended_at)

    def test_aio_attach_after_a_cut(self) -> None:
        srv = CutOutput()
        stand = Stand(self, srv)
        got: List[bytes] = []

        async def run() -> hiloop.Process:
            sb = stand.aio()
            try:
                return await sb.processes.attach("proc_1", got.append)
            finally:
                await sb._c.close()
        p = asyncio.run(run())
        self.assertEqual((b"".join(got), srv.offsets, p.exit_code), (b"abcdef", ["0", "3"], 5))

    def test_cut_raises_with_the_next_offset(self) -> None:
        stand = Stand(self, CutOutput())
        with stand.sandbox.processes.output("proc_1", follow=True) as out:
            self.assertEqual(out.read(), b"abc")
            with self.assertRaises(hiloop.StreamLostError) as e:
                out.read()
            self.assertEqual((e.exception.code, out.offset), ("stream_lost", 3))

    def test_output_gone_while_running_raises(self) -> None:
        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            if "/output?" in h.path:
                send_json(h, 410, {"error": {"code": "output_gone", "message": "gone"}})
            else:
                send_json(h, 200, RUNNING)
        stand = Stand(self, handler)
        with self.assertRaises(hiloop.HiloopError) as e:
            stand.sandbox.processes.attach("proc_1", lambda b: None)
        self.assertEqual((e.exception.code, e.exception.status), ("output_gone", 410))

    def test_cuts_that_read_nothing_raise(self) -> None:
        def handler(method: str, h: http.server.BaseHTTPRequestHandler) -> None:
            if "/output?" in h.path:
                chunked(h, 0, b"", whole=False)
            else:
                send_json(h, 200, RUNNING)
        stand = Stand(self, handler)
        with self.assertRaises(hiloop.StreamLostError):
            stand.sandbox.processes.attach("proc_1", lambda b: None)
        self.assertEqual(len([r for r in stand.requests if "/output?" in r[1]]), _core.MAX_EMPTY_CUTS + 1)

    def test_stdin_sent_once_and_capped(self) -> None:
        stand = Stand(self, lambda m, h: send_json(h, 409, {"error": {"code": "process_not_running"}}))
        with self.assertRaises(hiloop.ConflictError):
            stand.sandbox.processes.write_stdin("proc_1", b"x", close=True)
        self.assertEqual([(m, p, b) for m, p, _, b in stand.requests],
                         [("POST", "/v1/sandboxes/sbx_1/processes/proc_1/stdin?close=true", b"x")])
        with self.assertRaises(ValueError):
            stand.sandbox.processes.write_stdin("proc_1", b"x" * ((64 << 10) + 1))


class AnswerTest(unittest.TestCase):
    def test_run_output_bytes(self) -> None:
        raw = b"\xff\x00bin"
        r = _core.run_result({"exit_code": 0, "stdout": base64.b64encode(raw).decode(), "stderr": "",
                              "encoding": "base64"})
        self.assertEqual((r.stdout, r.stderr, r.encoding), (raw, b"", "base64"))
        r = _core.run_result({"exit_code": 0, "stdout": "é", "stderr": "e"})
        self.assertEqual((r.stdout, r.encoding), ("é".encode(), "utf-8"))
        for bad in ({"stdout": "!!", "stderr": "", "encoding": "base64"},
                    {"stdout": "é", "stderr": "", "encoding": "base64"},
                    {"stdout": "", "stderr": "", "encoding": "rot13"}):
            with self.assertRaises(hiloop.HiloopError) as e:
                _core.run_result(bad)
            self.assertEqual(e.exception.code, "bad_answer")

    def test_typed_answers(self) -> None:
        e = hiloop.FileEntry.from_json({"name": "a", "type": "file", "size": 3, "mode": 0o104755,
                                        "mtime": "2026-12-06T05:45:53Z", "path": "/a"})
        self.assertEqual((e.mode, e.size, e.path, e.mtime and e.mtime.tzinfo is not None), (0o4755, 3, "/a", True))
        listing = hiloop.FileList.from_json({"path": "/", "entries": [{"name": "a", "type": "dir"}],
                                             "truncated": "yes"})
        self.assertEqual(([x.name for x in listing], listing.truncated, listing.entries[0].size), (["a"], False, 0))
        p = hiloop.Process.from_json({"id": "proc_1", "exit_code": True, "command": "sh", "output_bytes": "9"})
        self.assertEqual((p.exit_code, p.command, p.output_bytes), (None, [], None))
        pv = hiloop.Preview.from_json({"id": "pv_1", "url": "http://pv-1.localhost/?hiloop_preview_token=hlp_x",
                                       "token": "hlp_x", "port": 80})
        self.assertNotIn("hlp_x", repr(pv))
        self.assertIn("hiloop_preview_token=...", repr(pv))
        for cls, bad in ((hiloop.FileEntry, {"name": "a"}), (hiloop.FileList, {"entries": None}),
                         (hiloop.FileList, {"entries": [{"type": "file"}]}), (hiloop.Process, {"state": "running"}),
                         (hiloop.Preview, {"id": "pv_1"}), (hiloop.Preview, [])):
            with self.subTest(cls=cls.__name__, bad=bad):
                with self.assertRaises(hiloop.HiloopError) as err:
                    cls.from_json(bad)  # type: ignore[attr-defined]
                self.assertEqual(err.exception.code, "bad_answer")

    def test_paths_not_utf8(self) -> None:
        stand = Stand(self, lambda m, h: send_json(h, 200, {"path": "/", "entries": []}))
        raw = os.fsdecode(b"/tmp/\xff")
        stand.sandbox.files.list(raw)
        self.assertIn("path=%2Ftmp%2F%FF", stand.requests[0][1])
        for name, call in (("path", lambda: stand.sandbox.files.remove(raw)),
                           ("path", lambda: stand.sandbox.files.mkdir(raw)),
                           ("from", lambda: stand.sandbox.files.rename(raw, "/b")),
                           ("to", lambda: stand.sandbox.files.rename("/a", raw))):
            with self.assertRaises(hiloop.InvalidRequestError) as e:
                call()
            self.assertEqual((e.exception.code, e.exception.field), ("invalid_path", name))
        self.assertEqual(len(stand.requests), 1)

    def test_exists_only_false_for_file_not_found(self) -> None:
        for code, status in (("file_not_found", 404), ("not_found", 404), ("shell_unavailable", 422)):
            with self.subTest(code=code):
                stand = Stand(self, lambda m, h: send_json(h, status, {"error": {"code": code}}))
                if code == "file_not_found":
                    self.assertFalse(stand.sandbox.files.exists("/x"))
                else:
                    with self.assertRaises(hiloop.HiloopError) as e:
                        stand.sandbox.files.exists("/x")
                    self.assertEqual(e.exception.code, code)
