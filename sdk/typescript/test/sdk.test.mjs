// The TypeScript SDK against a live hiloop (HILOOP_URL, HILOOP_TOKEN), as
// `make test` runs it (e2e's TestTypeScriptSDK). HILOOP_TEST_TOKEN_B is
// another organization's key on the same server.

import assert from "node:assert/strict";
import { createHash, randomUUID } from "node:crypto";
import { mkdtemp, mkdir, readFile, readdir, rm, stat, symlink, writeFile } from "node:fs/promises";
import { openAsBlob } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import * as hiloop from "hiloop";

const LIVE = Boolean(process.env.HILOOP_URL && process.env.HILOOP_TOKEN);
const IMAGE = "busybox";

function workdir() {
  return "/tmp/hiloop-ts-" + randomUUID().slice(0, 12);
}

async function localDir(t) {
  const d = await mkdtemp(join(tmpdir(), "hiloop-ts-"));
  t.after(() => rm(d, { recursive: true, force: true }));
  return d;
}

/** Asserts that fn rejects with an error of cls and code, and returns it. */
async function refused(fn, cls, code) {
  let err;
  await assert.rejects(fn, (e) => {
    err = e;
    return true;
  });
  assert.ok(err instanceof cls, `want ${cls.name}, got ${err}`);
  assert.equal(err.code, code, String(err));
  assert.ok(err instanceof hiloop.HiloopError);
  return err;
}

describe("a running sandbox", { skip: !LIVE && "needs a live hiloop (HILOOP_URL, HILOOP_TOKEN)" }, () => {
  let client, sb, work;

  before(async () => {
    client = new hiloop.Client();
    sb = await client.sandboxes.create(IMAGE, { ttl: "1h", labels: { suite: "typescript" } });
    work = workdir();
  });
  after(async () => {
    await sb?.delete();
  });

  it("is created running, and shown by get, list and events", async () => {
    assert.equal(sb.state, "running");
    assert.equal((await sb.refresh()).state, "running");
    assert.equal((await client.sandboxes.get(sb.id)).data.image, IMAGE);
    const ids = [];
    for await (const s of client.sandboxes.list({ labels: { suite: "typescript" }, limit: 1 })) ids.push(s.id);
    assert.ok(ids.includes(sb.id));
    const page = await client.sandboxes.page({ labels: { suite: "typescript" }, state: "running" });
    assert.ok(page.items.some((s) => s.id === sb.id));
    assert.ok((await sb.events()).some((e) => e.to === "running"));
    const org = await client.org();
    assert.ok(org.id && typeof org.max_sandboxes === "number", JSON.stringify(org));
  });

  it("changes its TTL and idle timeout, and counts a touch", async () => {
    const before = Date.parse(sb.data.expires_at);
    await sb.setTTL("3h");
    assert.ok(Date.parse(sb.data.expires_at) > before + 3600_000, sb.data.expires_at);
    await sb.update({ idleTimeout: "45m" });
    assert.equal(sb.data.idle_timeout, "45m0s");
    await sb.update({ ttl: "2h", idleTimeout: "0" });
    assert.equal(sb.data.idle_timeout, "0s");
    const last = Date.parse(sb.data.last_activity_at);
    await sb.touch();
    assert.ok(Date.parse(sb.data.last_activity_at) >= last);
    await refused(() => sb.update({ ttl: "1s" }), hiloop.InvalidRequestError, "invalid_field");
  });

  it("runs one-shot commands with exact exit codes", async () => {
    let r = await sb.run("echo out; echo err >&2");
    assert.deepEqual([r.exitCode, r.stdout, r.stderr, r.timedOut, r.ok], [0, "out\n", "err\n", false, true]);
    assert.equal((await sb.run(["sh", "-c", "exit 3"])).exitCode, 3);
    r = await sb.run("kill -9 $$");
    assert.deepEqual([r.exitCode, r.signal, r.timedOut], [137, "killed", false]);
    r = await sb.run(["sleep", "30"], { timeout: 1 });
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, undefined);
    // head -c: not every cluster delivers stdin's end to a command.
    assert.equal((await sb.run(["head", "-c", "4"], { stdin: "fed\n" })).stdout, "fed\n");
    await refused(() => sb.run([]), hiloop.InvalidRequestError, "invalid_field");
    // Output that is not UTF-8 comes back byte for byte; a byte that is
    // not UTF-8 in stderr alone leaves stdout's text as it was.
    r = await sb.run(["printf", "\\377\\000a"]);
    assert.deepEqual([r.exitCode, [...r.stdoutBytes], [...r.stderrBytes]], [0, [0xff, 0, 0x61], []]);
    r = await sb.run(["sh", "-c", "printf 'h\\303\\251llo'; printf '\\376' >&2"]);
    assert.deepEqual([r.stdout, [...r.stderrBytes]], ["h\u00e9llo", [0xfe]]);
  });

  it("streams a command's output and exit status", async () => {
    const chunks = [];
    let r = await sb.exec("for i in 1 2 3; do echo $i; done; echo e >&2; exit 3", { onStdout: (c) => chunks.push(Buffer.from(c)) });
    assert.deepEqual([r.exitCode, Buffer.concat(chunks).toString(), r.stderr], [3, "1\n2\n3\n", "e\n"]);
    r = await sb.exec(["sh", "-c", "kill -9 $$"]);
    assert.deepEqual([r.exitCode, r.signal], [137, "killed"]);
    r = await sb.exec(["sleep", "30"], { timeout: 1 });
    assert.deepEqual([r.timedOut, r.exitCode], [true, undefined]);
    await refused(() => sb.exec(["head", "-c", "300000", "/dev/zero"], { maxOutput: 100000 }), hiloop.LimitError, "output_limit");
    r = await sb.exec(["head", "-c", "300000", "/dev/zero"], { maxOutput: 300000 });
    assert.deepEqual([r.exitCode, r.stdoutBytes.length], [0, 300000]);
    r = await sb.exec(["head", "-c", "70000"], { stdin: new Uint8Array(70000).fill(65) });
    assert.deepEqual([r.exitCode, r.stdout], [0, "A".repeat(70000)]);
    // A refusal before the upgrade carries the API's code: over 24 h.
    await refused(() => sb.exec(["true"], { timeout: 25 * 3600 }), hiloop.InvalidRequestError, "invalid_field");
  });

  it("talks to a command: stdin written as it goes, a terminal and its size", async () => {
    const s = await sb.openExec(["head", "-n", "2"], { stdin: true });
    await s.write("one\n");
    await s.write(new TextEncoder().encode("two\n"));
    s.closeStdin();
    let r = await s.wait();
    assert.deepEqual([r.exitCode, r.stdout], [0, "one\ntwo\n"]);

    // The terminal's size shows once it has reached the terminal: each
    // line sent asks stty again, until the answer is the size wanted.
    let seen = "";
    let more = () => {};
    const tty = await sb.openExec(["sh", "-c", 'stty size; while read x; do [ "$x" = q ] && exit 5; stty size; done'], {
      tty: true,
      size: [100, 40],
      onStdout: (c) => {
        seen += new TextDecoder().decode(c);
        more();
      },
    });
    const until = async (size) => {
      while (!seen.includes(size)) {
        const output = new Promise((resolve) => (more = resolve));
        await tty.write("\r");
        await output;
      }
    };
    await until("40 100");
    tty.resize(132, 50);
    await until("50 132");
    await tty.write("q\r");
    r = await tty.wait();
    assert.equal(r.exitCode, 5);
    assert.equal(r.stderrBytes.length, 0);
  });

  it("writes and reads files, with their mode", async () => {
    const p = work + "/small/it's $(here).txt";
    const info = await sb.files.write(p, "hello\n", { mode: 0o600 });
    assert.deepEqual(info, { path: p, size: 6, sha256: createHash("sha256").update("hello\n").digest("hex") });
    assert.equal(await sb.files.readText(p), "hello\n");
    assert.deepEqual(await sb.files.read(p), new TextEncoder().encode("hello\n"));
    const r = await sb.run(["ls", "-ln", p]);
    assert.match(r.stdout, /^-rw-------/);
    await refused(() => sb.files.read(work + "/missing"), hiloop.NotFoundError, "file_not_found");
    await refused(() => sb.files.read("relative/path"), hiloop.InvalidRequestError, "invalid_path");
    await refused(() => sb.files.read(work + "/small"), hiloop.ConflictError, "path_conflict");
    await refused(() => sb.files.read(p, { maxBytes: 3 }), hiloop.LimitError, "output_limit");
  });

  it("moves a 20 MiB file each way, streamed", async (t) => {
    const dir = await localDir(t);
    const src = join(dir, "big");
    const data = new Uint8Array(20 << 20);
    for (let i = 0; i < data.length; i += 4096) data[i] = i % 251;
    await writeFile(src, data);
    const want = createHash("sha256").update(data).digest("hex");
    const info = await sb.files.write(work + "/big", await openAsBlob(src));
    assert.deepEqual([info.size, info.sha256], [data.length, want]);
    const parts = [];
    const n = await sb.files.readTo(work + "/big", new WritableStream({ write: (c) => void parts.push(Buffer.from(c)) }));
    assert.equal(n, data.length);
    assert.equal(createHash("sha256").update(Buffer.concat(parts)).digest("hex"), want);
  });

  it("copies a directory each way as tar, and never merges into one that exists", async (t) => {
    const dir = await localDir(t);
    const src = join(dir, "src");
    await mkdir(join(src, "sub", "deeper"), { recursive: true });
    await writeFile(join(src, "a.txt"), "a\n");
    await writeFile(join(src, "sub", "deeper", "b.bin"), new Uint8Array([0, 1, 2, 255]));
    await writeFile(join(src, "sub", "x".repeat(120)), "long name\n");
    await symlink("a.txt", join(src, "link"));
    const remote = work + "/tree";
    await sb.files.uploadDir(src, remote);
    assert.equal((await sb.run(["cat", remote + "/sub/" + "x".repeat(120)])).stdout, "long name\n");
    assert.equal((await sb.run(["readlink", remote + "/link"])).stdout, "a.txt\n");

    const out = join(dir, "out", "tree");
    await sb.files.downloadDir(remote, out);
    assert.equal(await readFile(join(out, "a.txt"), "utf8"), "a\n");
    assert.deepEqual([...(await readFile(join(out, "sub", "deeper", "b.bin")))], [0, 1, 2, 255]);
    assert.equal(await readFile(join(out, "sub", "x".repeat(120)), "utf8"), "long name\n");
    // Links in the stream are skipped.
    assert.ok(!(await readdir(out)).includes("link"));
    assert.deepEqual((await readdir(join(dir, "out"))).filter((n) => n.startsWith(".hiloop-")), []);

    await assert.rejects(sb.files.downloadDir(remote, out), (e) => e.code === "EEXIST");
    await writeFile(join(out, "a.txt"), "local\n");
    await writeFile(join(out, "mine"), "kept\n");
    await sb.files.downloadDir(remote, out, { overwrite: true });
    assert.equal(await readFile(join(out, "a.txt"), "utf8"), "a\n");
    assert.equal(await readFile(join(out, "mine"), "utf8"), "kept\n");

    await refused(() => sb.files.downloadDir(remote + "/a.txt", join(dir, "f")), hiloop.ConflictError, "path_conflict");
    await refused(() => sb.files.downloadDir(remote, join(dir, "small"), { maxEntries: 2 }), hiloop.LimitError, "extract_limit");
    await assert.rejects(stat(join(dir, "small")), (e) => e.code === "ENOENT");
    await refused(() => sb.files.downloadDir(work + "/none", join(dir, "none")), hiloop.NotFoundError, "file_not_found");
  });

  it("hides another organization's sandboxes: 404 not_found for every call", { skip: !process.env.HILOOP_TEST_TOKEN_B && "no HILOOP_TEST_TOKEN_B" }, async () => {
    const b = new hiloop.Client({ token: process.env.HILOOP_TEST_TOKEN_B });
    const sbB = await b.sandboxes.create(IMAGE, { ttl: "1h" });
    try {
      for (const [who, id] of [[b, sb.id], [client, sbB.id]]) {
        await refused(() => who.sandboxes.get(id), hiloop.NotFoundError, "not_found");
        const other = new hiloop.Sandbox(who, { id, state: "running" });
        const calls = [() => other.run("true"), () => other.exec("true"), () => other.files.read("/etc/hostname"),
          () => other.files.write(work + "/x", "x"), () => other.stop(), () => other.start(), () => other.touch(),
          () => other.update({ ttl: "2h" }), () => other.events(), () => other.delete(), () => other.wait("running")];
        for (const call of calls) {
          const e = await refused(call, hiloop.NotFoundError, "not_found");
          assert.equal(e.status, 404);
          assert.ok(e.requestId, "an error carries its request id");
        }
      }
      assert.equal((await sb.refresh()).state, "running");
    } finally {
      await sbB.delete();
    }
  });

  it("refuses a bad key with AuthenticationError", async () => {
    const bad = new hiloop.Client({ token: "hl_not_a_key" });
    await refused(() => bad.sandboxes.get(sb.id), hiloop.AuthenticationError, "unauthorized");
    await refused(() => new hiloop.Sandbox(bad, sb.data).exec("true"), hiloop.AuthenticationError, "unauthorized");
  });
});

describe("a sandbox's life", { skip: !LIVE && "needs a live hiloop (HILOOP_URL, HILOOP_TOKEN)" }, () => {
  it("makes one sandbox per idempotency key, and refuses the key with another body", async () => {
    const client = new hiloop.Client();
    const key = randomUUID();
    const first = await client.sandboxes.create(IMAGE, { ttl: "1h", idempotencyKey: key, wait: false });
    try {
      const again = await client.sandboxes.create(IMAGE, { ttl: "1h", idempotencyKey: key, wait: false });
      assert.equal(again.id, first.id);
      await refused(() => client.sandboxes.create(IMAGE, { ttl: "2h", idempotencyKey: key, wait: false }), hiloop.ConflictError, "idempotency_conflict");
      await refused(() => client.sandboxes.create(IMAGE, { ttl: "1000h" }), hiloop.InvalidRequestError, "invalid_field")
        .then((e) => assert.equal(e.field, "ttl"));
    } finally {
      await first.delete();
    }
  });

  it("stops, refuses commands while stopped, starts, and is deleted by await using", async () => {
    const client = new hiloop.Client({ wake: false });
    let id;
    {
      const sb = await client.sandboxes.create(IMAGE, { ttl: "1h" });
      try {
        id = sb.id;
        await sb.stop();
        await sb.wait("stopped", { timeout: 120 });
        await refused(() => sb.run("true"), hiloop.ConflictError, "sandbox_not_running");
        // A refusal before the exec stream's upgrade carries the API's code.
        await refused(() => sb.exec("true"), hiloop.ConflictError, "sandbox_not_running");
        await refused(() => sb.files.read("/etc/hostname"), hiloop.ConflictError, "sandbox_not_running");
        await refused(() => sb.wait("running", { timeout: 5 }), hiloop.WaitError, "wait_failed");
        await sb.start();
        await sb.wait("running", { timeout: 120 });
        assert.equal((await sb.run("true")).exitCode, 0);
      } finally {
        await sb[Symbol.asyncDispose]();
      }
    }
    assert.equal((await client.sandboxes.get(id)).data.desired, "deleted");
    const gone = await (await client.sandboxes.get(id)).wait("deleted", { timeout: 60 });
    assert.equal(gone.state, "deleted");
    await refused(() => gone.start(), hiloop.ConflictError, "conflict");
  });
});
