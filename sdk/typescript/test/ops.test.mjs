// The TypeScript SDK's file operations, background processes, env and cwd,
// binary run output and previews against a live hiloop (HILOOP_URL,
// HILOOP_TOKEN), as e2e's TestTypeScriptSDK runs it: serve has previews on
// (--preview-domain) and the forward transport, and HILOOP_TEST_TOKEN_B is
// another organization's key on the same server. Commands of kwok's
// simulated pods run on this machine, so a port is this machine's.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:net";
import { after, before, describe, it } from "node:test";

import * as hiloop from "hiloop";

const LIVE = Boolean(process.env.HILOOP_URL && process.env.HILOOP_TOKEN);

/** Asserts that fn rejects with an error of cls and code, and returns it. */
async function refused(fn, cls, code) {
  let err;
  await assert.rejects(fn, (e) => {
    err = e;
    return true;
  });
  assert.ok(err instanceof cls, `want ${cls.name}, got ${err}`);
  assert.equal(err.code, code, String(err));
  return err;
}

/** A TCP port free on this machine's loopback now. */
function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** The output of p from offset, followed to the process's end, as text. */
async function attached(p, offset = 0) {
  const parts = [];
  for await (const chunk of p.attach({ offset })) parts.push(Buffer.from(chunk));
  return Buffer.concat(parts).toString();
}

/** Reads p's output on until it holds want, and returns it. */
async function outputUntil(p, want) {
  let text = "";
  for await (const chunk of p.attach()) {
    text += Buffer.from(chunk).toString();
    if (text.includes(want)) return text;
  }
  throw new Error(`the process ended before printing ${JSON.stringify(want)}: ${JSON.stringify(text)}`);
}

describe("file operations, processes, env and previews", { skip: !LIVE && "needs a live hiloop (HILOOP_URL, HILOOP_TOKEN)" }, () => {
  let client, other, sb, foreign, work;

  before(async () => {
    client = new hiloop.Client();
    other = new hiloop.Client({ token: process.env.HILOOP_TEST_TOKEN_B });
    sb = await client.sandboxes.create("hiloop.local/python:3.11", { ttl: "1h", env: { GREETING: "it's $(not) run" } });
    // The same sandbox as another organization names it.
    foreign = new hiloop.Sandbox(other, sb.data);
    work = "/tmp/hiloop-ts-ops-" + randomUUID().slice(0, 12);
  });
  after(async () => {
    await sb?.files.remove(work, { recursive: true }).catch(() => {});
    await sb?.delete();
  });

  it("lists, stats, makes, renames and removes files, with typed entries", async () => {
    const dir = await sb.files.mkdir(work + "/sub");
    assert.equal(dir.type, "dir");
    assert.equal(dir.path, work + "/sub");
    assert.equal((await sb.files.mkdir(work + "/sub")).type, "dir", "an existing directory is no error");
    await sb.files.write(work + "/a.txt", "hello", { mode: 0o640 });
    await sb.files.write(work + "/-b 'c", "x");

    const list = await sb.files.list(work);
    assert.equal(list.path, work);
    assert.equal(list.truncated, false);
    assert.deepEqual(list.entries.map((e) => [e.name, e.type]), [["-b 'c", "file"], ["a.txt", "file"], ["sub", "dir"]]);
    const a = list.entries.find((e) => e.name === "a.txt");
    assert.equal(a.size, 5);
    assert.equal(a.mode, 0o640);
    assert.equal(a.path, undefined);
    assert.ok(Date.parse(a.mtime) > 0, a.mtime);

    const st = await sb.files.stat(work + "/a.txt");
    assert.deepEqual([st.name, st.path, st.type, st.size], ["a.txt", work + "/a.txt", "file", 5]);
    assert.equal(await sb.files.exists(work + "/a.txt"), true);
    assert.equal(await sb.files.exists(work + "/none"), false);

    await refused(() => sb.files.rename(work + "/a.txt", work + "/-b 'c"), hiloop.ConflictError, "path_conflict");
    const moved = await sb.files.rename(work + "/a.txt", work + "/-b 'c", { overwrite: true });
    assert.deepEqual([moved.path, moved.size], [work + "/-b 'c", 5]);
    const deep = await sb.files.rename(work + "/-b 'c", work + "/new/parents/c.txt");
    assert.equal(deep.name, "c.txt");
    assert.equal(await sb.files.readText(work + "/new/parents/c.txt"), "hello");

    await refused(() => sb.files.remove(work + "/new"), hiloop.ConflictError, "directory_not_empty");
    assert.equal(await sb.files.exists(work + "/new/parents/c.txt"), true, "a refused remove removes nothing");
    await sb.files.remove(work + "/new", { recursive: true });
    assert.equal(await sb.files.exists(work + "/new"), false);
    await sb.files.remove(work + "/sub");
    assert.deepEqual((await sb.files.list(work)).entries, []);
  });

  it("refuses file operations with the API's codes", async () => {
    await refused(() => sb.files.stat(work + "/missing"), hiloop.NotFoundError, "file_not_found");
    await refused(() => sb.files.list(work + "/missing"), hiloop.NotFoundError, "file_not_found");
    await refused(() => sb.files.remove(work + "/missing"), hiloop.NotFoundError, "file_not_found");
    await sb.files.write(work + "/f", "f");
    await refused(() => sb.files.list(work + "/f"), hiloop.ConflictError, "path_conflict");
    await refused(() => sb.files.mkdir(work + "/f/d"), hiloop.ConflictError, "path_conflict");
    const e = await refused(() => sb.files.stat("relative"), hiloop.InvalidRequestError, "invalid_path");
    assert.equal(e.field, "path");
    assert.equal((await refused(() => sb.files.rename(work + "/f", "/"), hiloop.InvalidRequestError, "invalid_path")).field, "to");
    await refused(() => sb.files.remove("/", { recursive: true }), hiloop.InvalidRequestError, "invalid_path");
  });

  it("is another organization's 404 not_found for every file operation, exists included", async () => {
    for (const call of [() => foreign.files.list(work), () => foreign.files.stat(work), () => foreign.files.exists(work),
      () => foreign.files.remove(work, { recursive: true }), () => foreign.files.mkdir(work + "/x"), () => foreign.files.rename(work, work + "2")]) {
      await refused(call, hiloop.NotFoundError, "not_found");
    }
    assert.equal(await sb.files.exists(work), true, "another organization's calls changed nothing");
  });

  it("runs a background process: list, get, stdin, output from an offset, exact exit code", async () => {
    const p = await sb.processes.start(["sh", "-c", 'echo one; read x; echo "got $x"; exit 7']);
    assert.ok(p instanceof hiloop.Process);
    assert.match(p.id, /^proc_/);
    assert.equal(p.state, "running");
    assert.deepEqual(p.data.command, ["sh", "-c", 'echo one; read x; echo "got $x"; exit 7']);
    assert.ok((await sb.processes.list()).some((q) => q.id === p.id));
    assert.equal((await sb.processes.get(p.id)).id, p.id);

    // The first line, then a cut (cancel): attaching again from the
    // offset reached reads the rest, nothing twice.
    const first = await p.output({ follow: true });
    assert.equal(first.offset, 0);
    let got = "";
    for await (const chunk of first) {
      got += Buffer.from(chunk).toString();
      if (got.includes("\n")) break;
    }
    assert.equal(got, "one\n");
    assert.equal(first.offset, 4);
    assert.equal(first.complete, false);
    await p.writeStdin("two\n");
    assert.equal(await attached(p, first.offset), "got two\n");

    assert.equal((await p.wait()).exitCode, 7);
    assert.equal(p.state, "exited");
    const whole = await p.output({ offset: 4 });
    assert.equal(whole.offset, 4);
    let rest = "";
    for await (const chunk of whole) rest += Buffer.from(chunk).toString();
    assert.equal(rest, "got two\n");
    assert.equal(whole.complete, true);
    await refused(() => p.writeStdin("late"), hiloop.ConflictError, "process_not_running");
    await refused(() => p.kill(), hiloop.ConflictError, "process_not_running");
  });

  it("closes a process's stdin, signals and kills it", async () => {
    const cat = await sb.processes.start("cat");
    await cat.writeStdin(new Uint8Array([0, 255, 10]));
    await cat.closeStdin();
    const parts = [];
    for await (const c of cat.attach()) parts.push(...c);
    assert.deepEqual(parts, [0, 255, 10]);
    assert.equal((await cat.wait()).exitCode, 0);

    const term = await sb.processes.start(["sleep", "1000"]);
    await term.signal("TERM");
    assert.equal((await term.wait()).exitCode, 143);
    const killed = await sb.processes.start(["sleep", "1000"]);
    await killed.kill();
    assert.equal((await killed.wait()).exitCode, 137);

    await refused(() => killed.signal("NOPE"), hiloop.InvalidRequestError, "invalid_field");
    await refused(() => sb.processes.get("proc_nosuch"), hiloop.NotFoundError, "not_found");
    await refused(() => sb.processes.start([]), hiloop.InvalidRequestError, "invalid_field");
    // env and cwd reach the process exactly; a cwd the sandbox lacks is file_not_found.
    const envd = await sb.processes.start(["sh", "-c", 'pwd; printf %s "$V"'], { env: { V: "a 'b' $(c)\n" }, cwd: "/tmp" });
    const got = [];
    for await (const c of envd.attach()) got.push(...c);
    assert.equal(new TextDecoder().decode(new Uint8Array(got)), "/tmp\na 'b' $(c)\n");
    await refused(() => sb.processes.start(["true"], { cwd: "/nonexistent" }), hiloop.NotFoundError, "file_not_found");
  });

  it("is output_gone for output older than the sandbox keeps", async () => {
    const p = await sb.processes.start(["sh", "-c", "head -c 8000000 /dev/zero"]);
    await p.wait();
    assert.equal(p.exitCode, 0);
    const e = await refused(() => p.output({ offset: 0 }), hiloop.HiloopError, "output_gone");
    assert.equal(e.status, 410);
  });

  it("is another organization's 404 not_found for every process call", async () => {
    const p = await sb.processes.start(["sleep", "1000"]);
    const theirs = new hiloop.Process(foreign, p.data);
    for (const call of [() => foreign.processes.start(["true"]), () => foreign.processes.list(), () => foreign.processes.get(p.id),
      () => theirs.output(), () => theirs.writeStdin("x"), () => theirs.signal("TERM"), () => theirs.kill(), () => theirs.wait()]) {
      await refused(call, hiloop.NotFoundError, "not_found");
    }
    assert.equal((await p.refresh()).state, "running");
    await p.kill();
  });

  it("runs with env and cwd, passed as they are, and stores a create's env", async () => {
    const env = { MSG: `it's "$(not)" run\n` };
    assert.deepEqual(sb.data.env, { GREETING: "it's $(not) run" });
    const run = await sb.run(["sh", "-c", 'printf %s "$MSG"; pwd'], { env: { MSG: env.MSG }, cwd: "/tmp" });
    assert.equal(run.exitCode, 0, run.stderr);
    assert.equal(run.stdout, env.MSG + "/tmp\n");
    const ex = await sb.exec(["sh", "-c", 'printf %s "$MSG"; pwd'], { env: { MSG: env.MSG }, cwd: "/tmp" });
    assert.equal(ex.stdout, env.MSG + "/tmp\n");
    const s = await sb.openExec(["sh", "-c", 'read x; echo "$x $MSG"; pwd'], { stdin: true, env: { MSG: "m" }, cwd: "/" });
    await s.write("in\n");
    assert.equal((await s.wait()).stdout, "in m\n/\n");

    assert.equal((await refused(() => sb.run(["true"], { cwd: "/nonexistent-dir" }), hiloop.NotFoundError, "file_not_found")).field, "cwd");
    assert.equal((await refused(() => sb.exec(["true"], { cwd: "/nonexistent-dir" }), hiloop.NotFoundError, "file_not_found")).field, "cwd");
    await refused(() => sb.run(["true"], { env: { HILOOP_X: "1" } }), hiloop.InvalidRequestError, "invalid_env");
    await refused(() => sb.run(["true"], { env: { "1BAD": "1" } }), hiloop.InvalidRequestError, "invalid_env");
    await refused(() => sb.exec(["true"], { env: { "A-B": "1" } }), hiloop.InvalidRequestError, "invalid_env");
    await refused(() => sb.run(["true"], { cwd: "rel" }), hiloop.InvalidRequestError, "invalid_path");
    await refused(() => client.sandboxes.create("busybox", { env: { HILOOP_TOKEN: "x" } }), hiloop.InvalidRequestError, "invalid_env");
  });

  it("gives run's output as the bytes the command wrote", async () => {
    const bin = await sb.run(["sh", "-c", "printf 'a\\377\\000b'; printf '\\376' >&2"]);
    assert.equal(bin.encoding, "base64");
    assert.deepEqual([...bin.stdoutBytes], [0x61, 0xff, 0x00, 0x62]);
    assert.deepEqual([...bin.stderrBytes], [0xfe]);
    assert.equal(bin.stdout, "a\ufffd\u0000b");
    const text = await sb.run(["printf", "h\u00e9llo"]);
    assert.equal(text.encoding, "utf-8");
    assert.equal(text.stdout, "h\u00e9llo");
    assert.deepEqual([...text.stdoutBytes], [...new TextEncoder().encode("h\u00e9llo")]);
  });

  it("serves a port at a preview URL, by token or by key, lists and revokes it", async () => {
    const port = await freePort();
    await sb.files.write(work + "/page.html", "hello from the sandbox");
    const app = await sb.processes.start(["python3", "-u", "-m", "http.server", String(port), "--bind", "127.0.0.1", "--directory", work]);
    try {
      await outputUntil(app, "Serving HTTP");
      const pv = await sb.previews.create(port, { ttl: "10m" });
      assert.match(pv.id, /^pv_/);
      assert.deepEqual([pv.port, pv.auth, pv.sandbox_id], [port, "token", sb.id]);
      assert.match(pv.token, /^hlp_/);
      assert.ok(pv.url.endsWith("?hiloop_preview_token=" + pv.token), pv.url);
      assert.ok(Date.parse(pv.expires_at) > Date.parse(pv.created_at));
      const page = new URL("/page.html", pv.url);
      let r = await fetch(page, { headers: { Authorization: `Bearer ${pv.token}` } });
      assert.equal(r.status, 200);
      assert.equal(await r.text(), "hello from the sandbox");
      r = await fetch(page);
      assert.equal(r.status, 404, "no token, no page");
      await r.body?.cancel();

      const byKey = await sb.previews.create(port, { auth: "key" });
      assert.equal(byKey.token, undefined);
      const keyPage = new URL("/page.html", byKey.url);
      r = await fetch(keyPage, { headers: { Authorization: `Bearer ${client.token}` } });
      assert.equal(await r.text(), "hello from the sandbox");
      r = await fetch(keyPage, { headers: { Authorization: `Bearer ${other.token}` } });
      assert.equal(r.status, 404, "another organization's key");
      await r.body?.cancel();

      const live = await sb.previews.list();
      assert.deepEqual(live.map((p) => p.id).sort(), [pv.id, byKey.id].sort());
      assert.ok(live.every((p) => p.token === undefined && !p.url.includes("hiloop_preview_token")), JSON.stringify(live));
      await sb.previews.revoke(pv.id);
      r = await fetch(page, { headers: { Authorization: `Bearer ${pv.token}` } });
      assert.equal(r.status, 404, "a revoked preview");
      await r.body?.cancel();
      assert.deepEqual((await sb.previews.list()).map((p) => p.id), [byKey.id]);
      await sb.previews.revoke(byKey.id);
      assert.deepEqual(await sb.previews.list(), []);
    } finally {
      await app.kill().catch(() => {});
    }
  });

  it("refuses a preview's bad fields, and is another organization's 404", async () => {
    assert.equal((await refused(() => sb.previews.create(0), hiloop.InvalidRequestError, "invalid_field")).field, "port");
    assert.equal((await refused(() => sb.previews.create(70000), hiloop.InvalidRequestError, "invalid_field")).field, "port");
    assert.equal((await refused(() => sb.previews.create(8000, { auth: "cookie" }), hiloop.InvalidRequestError, "invalid_field")).field, "auth");
    assert.equal((await refused(() => sb.previews.create(8000, { ttl: "1000h" }), hiloop.InvalidRequestError, "invalid_field")).field, "ttl");
    await refused(() => sb.previews.revoke("pv_nosuch"), hiloop.NotFoundError, "not_found");
    const pv = await sb.previews.create(8000);
    for (const call of [() => foreign.previews.create(8000), () => foreign.previews.list(), () => foreign.previews.revoke(pv.id)]) {
      await refused(call, hiloop.NotFoundError, "not_found");
    }
    assert.deepEqual((await sb.previews.list()).map((p) => p.id), [pv.id], "another organization's revoke did nothing");
    await sb.previews.revoke(pv.id);
  });
});
