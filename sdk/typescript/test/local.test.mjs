// The TypeScript SDK against a local stand-in for a server that is broken
// or hostile: retries with one Idempotency-Key, refusals before the exec
// stream's upgrade, redirects, and directories whose tar tries to escape,
// overflow or lie. Runs without a live hiloop.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { lstat, mkdir, mkdtemp, readdir, readFile, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import * as hiloop from "hiloop";

/** Serves handler on a loopback port for the test t; returns its URL. */
async function serve(t, handler) {
  const srv = createServer(handler);
  await new Promise((resolve) => srv.listen(0, "127.0.0.1", resolve));
  t.after(() => new Promise((resolve) => srv.close(resolve)));
  srv.closeIdleConnections?.();
  return `http://127.0.0.1:${srv.address().port}`;
}

function json(res, status, body, headers = {}) {
  const data = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data), ...headers });
  res.end(data);
}

async function localDir(t) {
  const d = await mkdtemp(join(tmpdir(), "hiloop-ts-local-"));
  t.after(() => rm(d, { recursive: true, force: true }));
  return d;
}

/** One tar header block. */
function header(name, type, size, { mode = 0o644, link = "", checksum } = {}) {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100, "utf8");
  h.write(mode.toString(8).padStart(7, "0"), 100);
  h.write("0000000", 108);
  h.write("0000000", 116);
  h.write(size.toString(8).padStart(11, "0"), 124);
  h.write("00000000000", 136);
  h.write(type, 156);
  h.write(link, 157, 100);
  h.write("ustar\x0000", 257);
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  h.write((checksum ?? sum).toString(8).padStart(6, "0") + "\0 ", 148);
  return h;
}

/** A tar of entries [name, type, data, opts], with or without its end. */
function tar(entries, end = true) {
  const parts = [];
  for (const [name, type, data = "", opts] of entries) {
    const d = Buffer.from(data);
    parts.push(header(name, type, d.length, opts), d, Buffer.alloc((512 - (d.length % 512)) % 512));
  }
  if (end) parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

/** A sandbox of a stand-in server that answers every files GET with body. */
async function tarServer(t, body) {
  const url = await serve(t, (req, res) => {
    res.writeHead(200, { "Content-Type": "application/x-tar", "Content-Length": body.length });
    res.end(body);
  });
  return new hiloop.Sandbox(new hiloop.Client({ url, token: "hl_x" }), { id: "sbx_1", state: "running" });
}

async function refused(fn, cls, code) {
  let err;
  await assert.rejects(fn, (e) => ((err = e), true));
  assert.ok(err instanceof cls, `want ${cls.name}, got ${err}`);
  assert.equal(err.code, code, String(err));
  return err;
}

describe("retries", () => {
  it("tries a create refused 503 and 429 with Retry-After again, with one Idempotency-Key", async (t) => {
    const keys = [];
    const url = await serve(t, (req, res) => {
      req.resume();
      keys.push(req.headers["idempotency-key"]);
      if (keys.length === 1) return json(res, 503, { error: { code: "storage_unavailable", message: "no" } }, { "Retry-After": "0" });
      if (keys.length === 2) return json(res, 429, { error: { code: "rate_limited", message: "no" } }, { "Retry-After": "0" });
      json(res, 201, { id: "sbx_1", state: "pending" });
    });
    const sb = await new hiloop.Client({ url, token: "hl_x" }).sandboxes.create("busybox", { wait: false });
    assert.equal(sb.id, "sbx_1");
    assert.equal(keys.length, 3);
    assert.ok(keys[0]);
    assert.equal(new Set(keys).size, 1);
  });

  it("does not retry a quota (429 without Retry-After)", async (t) => {
    let n = 0;
    const url = await serve(t, (req, res) => {
      req.resume();
      n++;
      json(res, 429, { error: { code: "quota_exceeded", message: "max_sandboxes", request_id: "req_1" } });
    });
    const e = await refused(() => new hiloop.Client({ url, token: "hl_x" }).sandboxes.create("busybox"), hiloop.QuotaError, "quota_exceeded");
    assert.deepEqual([n, e.requestId, e.status], [1, "req_1", 429]);
  });

  it("refuses a redirect", async (t) => {
    const url = await serve(t, (req, res) => {
      res.writeHead(307, { Location: "https://elsewhere.invalid/v1/org" });
      res.end();
    });
    await refused(() => new hiloop.Client({ url, token: "hl_x" }).org(), hiloop.HiloopError, "redirect");
  });

  it("reads the API's refusal of the exec stream's upgrade, retrying one with Retry-After", async (t) => {
    const seen = [];
    const url = await serve(t, (req, res) => {
      seen.push([req.headers.authorization, req.headers["sec-websocket-protocol"], req.url]);
      if (seen.length === 1) return json(res, 429, { error: { code: "exec_limit", message: "at most 8" } }, { "Retry-After": "0" });
      json(res, 409, { error: { code: "sandbox_quarantined", message: "quarantined", request_id: "req_q" } });
    });
    const sb = new hiloop.Sandbox(new hiloop.Client({ url, token: "hl_x" }), { id: "sbx_1", state: "running" });
    const e = await refused(() => sb.exec(["secret", "argv"]), hiloop.ConflictError, "sandbox_quarantined");
    assert.equal(e.requestId, "req_q");
    assert.equal(seen.length, 2);
    assert.deepEqual(seen[0].slice(0, 2), ["Bearer hl_x", "hiloop.exec.v1"]);
    // The argv travels in the first message, never in the URL.
    assert.ok(!seen[0][2].includes("secret"), seen[0][2]);
  });
});

describe("a broken server", () => {
  it("cuts a file short of its Content-Length: read throws, never returns short", async (t) => {
    const url = await serve(t, (req, res) => {
      res.writeHead(200, { "Content-Type": "application/octet-stream", "Content-Length": 100 });
      res.write("0123456789", () => res.socket.destroy());
    });
    const sb = new hiloop.Sandbox(new hiloop.Client({ url, token: "hl_x" }), { id: "sbx_1", state: "running" });
    await assert.rejects(sb.files.read("/f"));
    await assert.rejects(sb.files.readTo("/f", new WritableStream()));
  });

  // A WebSocket server of a few lines: the handshake, then the frames.
  const frames = {
    "an exit frame that is not JSON": Buffer.from([0x82, 4, 3, 0x6e, 0x6f, 0x21]),
    "output, then no exit frame": Buffer.from([0x82, 3, 1, 0x68, 0x69]),
  };
  for (const [name, frame] of Object.entries(frames)) {
    it(`sends ${name}: StreamLostError, never an exit code`, async (t) => {
      const { createHash } = await import("node:crypto");
      const srv = createServer();
      srv.on("upgrade", (req, socket) => {
        const accept = createHash("sha1").update(req.headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest("base64");
        socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
          `Sec-WebSocket-Accept: ${accept}\r\nSec-WebSocket-Protocol: hiloop.exec.v1\r\n\r\n`);
        socket.once("data", () => socket.end(frame));
      });
      await new Promise((resolve) => srv.listen(0, "127.0.0.1", resolve));
      t.after(() => new Promise((resolve) => srv.close(resolve)));
      const sb = new hiloop.Sandbox(new hiloop.Client({ url: `http://127.0.0.1:${srv.address().port}`, token: "hl_x" }), { id: "sbx_1", state: "running" });
      await refused(() => sb.exec("true"), hiloop.StreamLostError, "stream_lost");
    });
  }
});

describe("the key in the clear", () => {
  it("goes over plain http:// only to loopback", () => {
    for (const url of ["http://127.attacker.example", "http://10.0.0.1:8080", "http://example.com"]) {
      assert.throws(() => new hiloop.Client({ url, token: "hl_x" }), TypeError, url);
    }
    for (const url of ["http://localhost:8080", "http://127.0.0.1", "http://127.1.2.3:9", "http://[::1]:8080", "https://example.com"]) {
      assert.equal(new hiloop.Client({ url, token: "hl_x" }).url, url.replace(/\/$/, ""));
    }
  });
});

describe("a hostile directory", () => {
  const cases = {
    "an entry outside": [tar([["ok", "0", "x"], ["../evil", "0", "x"]]), hiloop.ExtractError, "invalid_path"],
    "an absolute entry": [tar([["/etc/evil", "0", "x"]]), hiloop.ExtractError, "invalid_path"],
    "a sparse file": [tar([["s", "S", "x"]]), hiloop.ExtractError, "sparse_entry"],
    "a cut stream": [tar([["a", "0", "x"]], false), hiloop.ExtractError, "invalid_tar"],
    "a wrong checksum": [tar([["a", "0", "x", { checksum: 7 }]]), hiloop.ExtractError, "invalid_tar"],
    "a file named twice": [tar([["a", "0", "x"], ["a", "0", "y"]]), hiloop.ExtractError, "path_conflict"],
    "a file where a directory goes": [tar([["a", "0", "x"], ["a/b", "0", "y"]]), hiloop.ExtractError, "path_conflict"],
    "more bytes than maxBytes": [tar([["a", "0", "x".repeat(2000)]]), hiloop.LimitError, "extract_limit"],
    "more entries than maxEntries": [tar([["a", "0"], ["b", "0"], ["c", "0"], ["d", "0"]]), hiloop.LimitError, "extract_limit"],
  };
  for (const [name, [body, cls, code]] of Object.entries(cases)) {
    it(`refuses ${name} and leaves nothing`, async (t) => {
      const dir = await localDir(t);
      const sb = await tarServer(t, body);
      await refused(() => sb.files.downloadDir("/d", join(dir, "out"), { maxBytes: 1000, maxEntries: 3 }), cls, code);
      assert.deepEqual(await readdir(dir), []);
    });
  }

  it("skips links, devices and fifos, and drops setuid bits", async (t) => {
    const dir = await localDir(t);
    const sb = await tarServer(t, tar([["d/", "5", "", { mode: 0o7777 }], ["d/f", "0", "hi", { mode: 0o4755 }],
      ["l", "2", "", { link: "/etc/passwd" }], ["h", "1", "", { link: "d/f" }], ["c", "3"], ["p", "6"]]));
    await sb.files.downloadDir("/d", join(dir, "out"));
    assert.deepEqual((await readdir(join(dir, "out"))).sort(), ["d"]);
    assert.equal(await readFile(join(dir, "out", "d", "f"), "utf8"), "hi");
    assert.equal((await lstat(join(dir, "out", "d", "f"))).mode & 0o7000, 0);
    assert.equal((await lstat(join(dir, "out", "d"))).mode & 0o7000, 0);
  });

  it("with overwrite, never writes through a link already in the destination", async (t) => {
    const dir = await localDir(t);
    const outside = join(dir, "outside");
    await mkdir(outside);
    const out = join(dir, "out");
    await mkdir(out);
    await symlink(outside, join(out, "esc"));
    await symlink(join(outside, "target"), join(out, "file"));
    const sb = await tarServer(t, tar([["esc/x", "0", "evil"]]));
    await refused(() => sb.files.downloadDir("/d", out, { overwrite: true }), hiloop.ExtractError, "path_conflict");
    const sb2 = await tarServer(t, tar([["file", "0", "new"]]));
    await sb2.files.downloadDir("/d", out, { overwrite: true });
    assert.deepEqual(await readdir(outside), []);
    assert.equal(await readFile(join(out, "file"), "utf8"), "new");
    assert.ok((await lstat(join(out, "file"))).isFile());
  });
});
