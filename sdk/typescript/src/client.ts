// hiloop's TypeScript client: sandboxes, commands and files over the HTTP
// API and the exec WebSocket, with the runtime's global fetch and WebSocket
// alone. Every call goes through one request core (Client.request), so a
// new endpoint is one method that names its route.

import { ConflictError, errorFor, HiloopError, LimitError, WaitError } from "./errors.js";
import type { Event, ExecRunResponse, FileInfo, Org, Resources, SandboxInfo, SandboxList, State, Volume } from "./types.js";
import { CommandResult, openExec, type ExecOptions, type ExecSession } from "./exec.js";
import { Files } from "./files.js";
import { Processes } from "./processes.js";
import { Previews } from "./previews.js";

/** How long a call that may wake a sandbox waits beyond its own time, in
 * seconds: serve's --wake-timeout, by default. */
export const WAKE_WAIT = 120;
/** The largest JSON answer read: run's, with 1 MiB of each stream escaped,
 * is well below. */
export const MAX_ANSWER = 32 << 20;
/** How much longer than its command's timeout run waits for its answer, in
 * seconds. */
const RUN_MARGIN = 60;
/** The server's default command timeout (api.DefaultExecTimeout), seconds. */
const DEFAULT_EXEC_TIMEOUT = 60;

/** States from which waiting for another cannot succeed. */
const FAILED: ReadonlySet<string> = new Set(["exited", "expired", "deleted", "lost", "attention", "quarantined", "failed"]);

/** What a call sends: a string, bytes, a Blob, a stream. */
export type BodyInit = NonNullable<RequestInit["body"]>;

/** A command: a string runs through sh -c, an array is the argv as is. */
export type Command = string | readonly string[];

/** The argv of cmd. */
export function argv(cmd: Command): string[] {
  return typeof cmd === "string" ? ["sh", "-c", cmd] : [...cmd];
}

/** How a Client reaches the API. */
export interface ClientOptions {
  /** The API's URL; HILOOP_URL, else hiloop dev's http://127.0.0.1:8080. */
  url?: string;
  /** The API key; HILOOP_TOKEN. */
  token?: string;
  /** Seconds a JSON call may take, its answer included (120). */
  timeout?: number;
  /** How often a 429 or 503 with Retry-After is tried again (4). */
  maxRetries?: number;
  /** Whether run, exec and the file calls wake a sandbox stopped for
   * idleness and wait for it (?wake=true; true). With false such a sandbox
   * is a ConflictError with code sandbox_not_running. A sandbox its owner
   * stopped is never woken. */
  wake?: boolean;
}

/** One call of the API, as the request core sends it. */
export interface Call {
  method: string;
  /** The path under the API's URL, query included. */
  path: string;
  /** The body of each try: called again for a retry. */
  body?: () => BodyInit | undefined;
  headers?: Record<string, string>;
  /** Seconds until the answer's headers (with wholeAnswer, its body too)
   * must have arrived; the client's timeout when absent. */
  timeout?: number;
  /** Cancels the call. */
  signal?: AbortSignal;
  /** Sends it once: not again after a 429 or 503, since a second try
   * would do a second thing (a preview's create). */
  once?: boolean;
}

/** An answer of the request core: the response, and the signal that cuts
 * its body (at the call's deadline, or when done is called). */
export interface Answer {
  response: Response;
  /** Stops the call's deadline; call it once the body is read or dropped. */
  done(): void;
  /** Whether the call's deadline passed. */
  late(): boolean;
  /** Cuts the call, its body included, with reason. */
  abort(reason: unknown): void;
}

/** Reports whether host names this machine's loopback: localhost, or an
 * address in 127.0.0.0/8 or ::1 (as the Go client decides). */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, "");
  if (h === "localhost" || h === "::1" || h === "0:0:0:0:0:0:0:1") return true;
  const v4 = h.startsWith("::ffff:") ? h.slice(7) : h;
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(v4);
  if (m && m.slice(1).every((p) => Number(p) <= 255)) return m[1] === "127";
  // The WHATWG URL parser writes ::ffff:127.0.0.1 as ::ffff:7f00:1.
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(h);
  return mapped !== null && parseInt(mapped[1]!, 16) >> 8 === 127;
}

function env(name: string): string | undefined {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return p?.env?.[name] || undefined;
}

/** Resolves after seconds, or rejects when signal aborts. */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      resolve();
    }, seconds * 1000);
    const abort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", abort, { once: true });
  });
}

/** The Retry-After of a 429 or 503, in seconds; undefined otherwise. */
function retryAfter(status: number, headers: Headers): number | undefined {
  const ra = headers.get("retry-after");
  if ((status !== 429 && status !== 503) || ra === null) return undefined;
  const n = Number(ra);
  return Number.isFinite(n) ? Math.max(n, 0.1) : 1;
}

/** The error an error answer's status, headers and body tell. */
export function errorOf(status: number, headers: Headers, body: string): HiloopError {
  let code = `http_${status}`;
  let message = body.trim();
  let field = "";
  let requestId = "";
  try {
    const e = JSON.parse(body).error;
    if (e && typeof e.code === "string") {
      code = e.code;
      message = typeof e.message === "string" ? e.message : "";
      field = typeof e.field === "string" ? e.field : "";
      requestId = typeof e.request_id === "string" ? e.request_id : "";
    }
  } catch {
    // Not hiloop's error body: the status and the text tell what there is.
  }
  requestId ||= headers.get("x-request-id") ?? "";
  return errorFor(status, message, { code, field, requestId, retryAfter: retryAfter(status, headers) });
}

/** The body of r, refused with LimitError past cap bytes. */
export async function readCapped(r: Response, cap: number, what: string): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  let n = 0;
  if (r.body) {
    for await (const chunk of r.body as unknown as AsyncIterable<Uint8Array>) {
      n += chunk.length;
      if (n > cap) {
        await r.body.cancel().catch(() => {});
        throw new LimitError(`${what} is larger than ${cap} bytes`, { code: "output_limit" });
      }
      parts.push(chunk);
    }
  }
  return concat(parts, n);
}

/** The chunks joined into one array of n bytes. */
export function concat(parts: readonly Uint8Array[], n = parts.reduce((s, p) => s + p.length, 0)): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** A client of the hiloop API. */
export class Client {
  readonly url: string;
  readonly token: string;
  readonly timeout: number;
  readonly maxRetries: number;
  readonly wake: boolean;
  /** Create, get and list sandboxes. */
  readonly sandboxes: Sandboxes;

  constructor(opts: ClientOptions = {}) {
    this.url = (opts.url || env("HILOOP_URL") || "http://127.0.0.1:8080").replace(/\/+$/, "");
    this.token = opts.token ?? env("HILOOP_TOKEN") ?? "";
    this.timeout = opts.timeout ?? 120;
    this.maxRetries = opts.maxRetries ?? 4;
    this.wake = opts.wake ?? true;
    const u = new URL(this.url);
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new TypeError(`HILOOP_URL ${JSON.stringify(this.url)}: want http:// or https://`);
    }
    if (u.protocol === "http:" && !isLoopback(u.hostname)) {
      throw new TypeError(`refusing to send the API key over plain http:// to ${u.host}; use https://`);
    }
    this.sandboxes = new Sandboxes(this);
  }

  /**
   * Sends a call and returns the answer of a status below 300; an error
   * status throws its HiloopError, and a redirect (which hiloop never
   * sends) a HiloopError too. A 429 or 503 with Retry-After is tried again
   * after the wait it asks, up to maxRetries times.
   */
  async request(call: Call): Promise<Answer> {
    for (let attempt = 0; ; attempt++) {
      if (call.signal?.aborted) throw call.signal.reason;
      const ctl = new AbortController();
      let late = false;
      const timer = setTimeout(() => {
        late = true;
        ctl.abort(new HiloopError(`${call.method} ${call.path.split("?")[0]}: no whole answer within ${call.timeout ?? this.timeout}s`, { code: "timeout" }));
      }, (call.timeout ?? this.timeout) * 1000);
      const onAbort = () => ctl.abort(call.signal!.reason);
      call.signal?.addEventListener("abort", onAbort, { once: true });
      const done = () => {
        clearTimeout(timer);
        call.signal?.removeEventListener("abort", onAbort);
      };
      let response: Response;
      try {
        const headers: Record<string, string> = { ...call.headers };
        if (this.token) headers["Authorization"] = "Bearer " + this.token;
        const body = call.body?.();
        const init: RequestInit & { duplex?: string } = { method: call.method, headers, body, redirect: "manual", signal: ctl.signal };
        if (body instanceof ReadableStream) init.duplex = "half";
        response = await fetch(this.url + call.path, init);
      } catch (e) {
        done();
        throw late || call.signal?.aborted ? ctl.signal.reason : e;
      }
      if (response.status < 300) return { response, done, late: () => late, abort: (r) => ctl.abort(r) };
      let err: HiloopError;
      try {
        if (response.status < 400) {
          await response.body?.cancel();
          err = new HiloopError(`the API answered with a redirect to ${response.headers.get("location") ?? "?"}, which hiloop's API never sends; point the client at the API itself (HILOOP_URL)`, { code: "redirect", status: response.status });
        } else {
          const text = new TextDecoder().decode(await readCapped(response, 64 << 10, "an error answer").catch(() => new Uint8Array()));
          err = errorOf(response.status, response.headers, text);
        }
      } finally {
        done();
      }
      if (attempt >= this.maxRetries || call.once || err.retryAfter === undefined) throw err;
      await sleep(Math.min(err.retryAfter, 60), call.signal);
    }
  }

  /** Sends a call, with payload as its JSON body if given, and returns its
   * JSON answer, which must arrive whole within the call's timeout and be at
   * most 32 MiB. */
  async json<T>(call: Call & { payload?: unknown }): Promise<T> {
    const headers = { ...call.headers };
    let body = call.body;
    if (call.payload !== undefined) {
      const text = JSON.stringify(call.payload);
      headers["Content-Type"] = "application/json";
      body = () => text;
    }
    const a = await this.request({ ...call, headers, body });
    try {
      const data = await readCapped(a.response, MAX_ANSWER, `the answer to ${call.method} ${call.path.split("?")[0]}`);
      if (a.response.status === 204 || data.length === 0) return undefined as T;
      return JSON.parse(new TextDecoder().decode(data)) as T;
    } catch (e) {
      if (a.late()) throw new HiloopError(`${call.method} ${call.path.split("?")[0]}: no whole answer within ${call.timeout ?? this.timeout}s`, { code: "timeout", cause: e });
      throw e;
    } finally {
      a.done();
    }
  }

  /** The caller's organization, its quotas and its live sessions. */
  org(opts: { signal?: AbortSignal } = {}): Promise<Org> {
    return this.json<Org>({ method: "GET", path: "/v1/org", signal: opts.signal });
  }
}

/** How to make a sandbox: create's options besides its image. */
export interface CreateOptions {
  ttl?: string;
  volumes?: Volume[];
  labels?: Record<string, string>;
  transports?: string[];
  resources?: Resources;
  shutdownPolicy?: string;
  idleTimeout?: string;
  /** The workload container's environment beside the image's: every
   * process in the sandbox, each exec's too, sees it. Stored with the
   * sandbox and shown by every read of it. */
  env?: Record<string, string>;
  /** Wait until the sandbox runs (true). */
  wait?: boolean;
  /** Seconds to wait for it (300). */
  waitTimeout?: number;
  /** The Idempotency-Key of the create; a fresh one when absent. */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

/** Which sandboxes list returns. */
export interface ListOptions {
  state?: State;
  /** Each must match (label=k=v, ANDed). */
  labels?: Record<string, string>;
  /** The page size, 1 to 1000 (the server's 100). */
  limit?: number;
  signal?: AbortSignal;
}

function sandboxPath(id: string, rest = ""): string {
  return "/v1/sandboxes/" + encodeURIComponent(id) + rest;
}

/** client.sandboxes: create, get and list sandboxes. */
export class Sandboxes {
  constructor(private readonly c: Client) {}

  /** Creates a sandbox and, with wait (the default), waits until it runs.
   * Every try of the call carries one Idempotency-Key, so retries make one
   * sandbox; so does a second create with the same idempotencyKey. */
  async create(image: string, opts: CreateOptions = {}): Promise<Sandbox> {
    const req: Record<string, unknown> = { image };
    const fields: [string, unknown][] = [["ttl", opts.ttl], ["volumes", opts.volumes], ["labels", opts.labels],
      ["transports", opts.transports], ["resources", opts.resources], ["shutdown_policy", opts.shutdownPolicy],
      ["idle_timeout", opts.idleTimeout], ["env", opts.env]];
    for (const [k, v] of fields) if (v !== undefined) req[k] = v;
    const key = opts.idempotencyKey ?? crypto.randomUUID();
    const sb = new Sandbox(this.c, await this.c.json<SandboxInfo>({
      method: "POST", path: "/v1/sandboxes", payload: req, headers: { "Idempotency-Key": key }, signal: opts.signal }));
    if (opts.wait ?? true) await sb.wait("running", { timeout: opts.waitTimeout ?? 300, signal: opts.signal });
    return sb;
  }

  /** The sandbox id; NotFoundError for one that is not your organization's. */
  async get(id: string, opts: { signal?: AbortSignal } = {}): Promise<Sandbox> {
    return new Sandbox(this.c, await this.c.json<SandboxInfo>({ method: "GET", path: sandboxPath(id), signal: opts.signal }));
  }

  /** One page of the sandboxes the filters select, from after the cursor
   * after ("" for the first page); its next is the following page's. */
  page(opts: ListOptions & { after?: string } = {}): Promise<SandboxList> {
    const q = new URLSearchParams();
    if (opts.state) q.append("state", opts.state);
    for (const [k, v] of Object.entries(opts.labels ?? {})) q.append("label", `${k}=${v}`);
    if (opts.limit) q.append("limit", String(opts.limit));
    if (opts.after) q.append("after", opts.after);
    const qs = q.toString();
    return this.c.json<SandboxList>({ method: "GET", path: "/v1/sandboxes" + (qs ? "?" + qs : ""), signal: opts.signal });
  }

  /** Every sandbox the filters select, page by page, in creation order:
   * `for await (const sb of client.sandboxes.list())`. */
  async *list(opts: ListOptions = {}): AsyncGenerator<Sandbox, void, undefined> {
    let after = "";
    for (;;) {
      const page = await this.page({ ...opts, after });
      for (const item of page.items) yield new Sandbox(this.c, item);
      after = page.next ?? "";
      if (!after) return;
    }
  }
}

/** How wait waits. */
export interface WaitOptions {
  /** Seconds to wait in all (300); past them a WaitError wait_timeout. */
  timeout?: number;
  signal?: AbortSignal;
}

/** How run runs a command. */
export interface RunOptions {
  /** Seconds the command may run (the server's 60); past them the result
   * says timedOut. */
  timeout?: number;
  /** Given to the command, then closed; without it the command gets no
   * stdin. Bytes must be UTF-8: the one-shot call carries text. */
  stdin?: string | Uint8Array;
  /** Variables added to the command's environment (see ExecOptions.env). */
  env?: Record<string, string>;
  /** The absolute directory the command runs in (see ExecOptions.cwd). */
  cwd?: string;
  signal?: AbortSignal;
}

/** One sandbox. `await using sb = ...` deletes it at the end of the block. */
export class Sandbox {
  /** The sandbox as the API last showed it. */
  data: SandboxInfo;
  readonly id: string;
  /** Files and directories in and out of the sandbox, and operations on
   * them. */
  readonly files: Files;
  /** Background processes. */
  readonly processes: Processes;
  /** Its ports at preview URLs. */
  readonly previews: Previews;

  constructor(readonly client: Client, data: SandboxInfo) {
    this.data = data;
    this.id = data.id;
    this.files = new Files(this);
    this.processes = new Processes(this);
    this.previews = new Previews(this);
  }

  /** The state the API last showed. */
  get state(): State {
    return this.data.state;
  }

  toString(): string {
    return `Sandbox(${this.id}, ${this.state})`;
  }

  /** The API path of this sandbox, with rest after it. */
  path(rest = ""): string {
    return sandboxPath(this.id, rest);
  }

  private async set(p: Promise<SandboxInfo>): Promise<this> {
    this.data = await p;
    return this;
  }

  private act(method: string, rest: string, signal?: AbortSignal, payload?: unknown): Promise<this> {
    return this.set(this.client.json<SandboxInfo>({ method, path: this.path(rest), payload, signal }));
  }

  /** Reads the sandbox again. */
  refresh(opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.act("GET", "", opts.signal);
  }

  /** Stops it; it stays stopped until a start. */
  stop(opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.act("POST", "/stop", opts.signal);
  }

  /** Starts it again. */
  start(opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.act("POST", "/start", opts.signal);
  }

  /** Deletes it. */
  delete(opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.act("DELETE", "", opts.signal);
  }

  /** Counts a use now: its idle clock starts again. */
  touch(opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.act("POST", "/touch", opts.signal);
  }

  /** Changes its lifetime: ttl makes it expire that long from now (extend
   * or shorten), idleTimeout changes its idle timeout ("0" turns idle stop
   * off); either or both. */
  update(change: { ttl?: string; idleTimeout?: string; signal?: AbortSignal }): Promise<this> {
    const body: Record<string, string> = {};
    if (change.ttl !== undefined) body["ttl"] = change.ttl;
    if (change.idleTimeout !== undefined) body["idle_timeout"] = change.idleTimeout;
    return this.act("PATCH", "", change.signal, body);
  }

  /** Sets its expiry to now plus ttl (update({ttl})). */
  setTTL(ttl: string, opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.update({ ttl, signal: opts.signal });
  }

  /** Its state transitions, oldest first. */
  async events(opts: { signal?: AbortSignal } = {}): Promise<Event[]> {
    return (await this.client.json<{ items: Event[] }>({ method: "GET", path: this.path("/events"), signal: opts.signal })).items;
  }

  /** Waits on the long poll until the sandbox is in state; WaitError
   * (wait_failed) when it reaches a state that will not lead there, or
   * (wait_timeout) past the timeout. */
  async wait(state: State = "running", opts: WaitOptions = {}): Promise<this> {
    const deadline = Date.now() + (opts.timeout ?? 300) * 1000;
    await this.refresh(opts);
    while (this.state !== state) {
      if (FAILED.has(this.state) || (state === "running" && this.data.desired !== "running")) {
        throw new WaitError(`sandbox ${this.id} is ${this.state}${this.data.reason ? ` (${this.data.reason})` : ""}, waiting for ${state}`, { code: "wait_failed" });
      }
      const left = (deadline - Date.now()) / 1000;
      if (left <= 0) {
        throw new WaitError(`timed out waiting for ${state}; sandbox ${this.id} is ${this.state}`, { code: "wait_timeout" });
      }
      const wait = Math.max(1, Math.min(30, Math.floor(left)));
      const before = this.state;
      const asked = Date.now();
      const q = new URLSearchParams({ while: before, wait: `${wait}s` });
      await this.set(this.client.json<SandboxInfo>({ method: "GET", path: this.path("?" + q), timeout: wait + 30, signal: opts.signal }));
      // An answer in the same state before the wait is up (the server is
      // shutting down, or the key has too many long polls) is followed by
      // a pause, not at once by the next call.
      if (this.state === before && Date.now() - asked < wait * 1000) await sleep(0.2, opts.signal);
    }
    return this;
  }

  /** Runs a one-shot command (POST .../exec/run): each of stdout and stderr
   * holds up to 1 MiB (stdoutTruncated says when more was dropped), as the
   * bytes the command wrote (stdoutBytes; stdout is their UTF-8 text),
   * whether the server sent them as text or, for output that is not
   * UTF-8, in base64 (encoding). A command past its timeout comes back
   * with timedOut, not an error. */
  async run(cmd: Command, opts: RunOptions = {}): Promise<CommandResult> {
    const req: Record<string, unknown> = { command: argv(cmd) };
    if (opts.timeout !== undefined) req["timeout"] = `${Math.round(opts.timeout * 1000)}ms`;
    if (opts.stdin !== undefined) req["stdin"] = typeof opts.stdin === "string" ? opts.stdin : new TextDecoder().decode(opts.stdin);
    if (opts.env !== undefined) req["env"] = opts.env;
    if (opts.cwd !== undefined) req["cwd"] = opts.cwd;
    let path = this.path("/exec/run");
    let wait = (opts.timeout ?? DEFAULT_EXEC_TIMEOUT) + RUN_MARGIN;
    if (this.client.wake) {
      path += "?wake=true";
      wait += WAKE_WAIT;
    }
    const r = await this.client.json<ExecRunResponse>({ method: "POST", path, payload: req, timeout: wait, signal: opts.signal });
    if (r.encoding === "base64") {
      return new CommandResult(r.exit_code, fromBase64(r.stdout), fromBase64(r.stderr), r.timed_out, r.signal ?? "",
        r.stdout_truncated, r.stderr_truncated, "base64");
    }
    return CommandResult.fromText(r.exit_code, r.stdout, r.stderr, r.timed_out, r.signal ?? "", r.stdout_truncated, r.stderr_truncated);
  }

  /** Runs a command over the exec WebSocket and returns how it ended. Its
   * output goes to onStdout and onStderr as it comes; without them it is
   * collected in the result, up to maxOutput bytes each (LimitError
   * output_limit past that). A stream that breaks before the exit status
   * throws StreamLostError; a command past its timeout comes back with
   * timedOut. */
  async exec(cmd: Command, opts: ExecOptions = {}): Promise<CommandResult> {
    const s = await this.openExec(cmd, opts);
    return s.wait();
  }

  /** Opens an exec session for a conversation with the command: write to
   * its stdin, close it, resize its terminal, and wait for its end. */
  openExec(cmd: Command, opts: ExecOptions = {}): Promise<ExecSession> {
    return openExec(this, argv(cmd), opts);
  }

  /** Deletes the sandbox: `await using sb = await client.sandboxes.create(...)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.delete();
  }
}

/** The bytes of standard (padded) base64 text; a malformed one is
 * HiloopError bad_answer. */
export function fromBase64(text: string): Uint8Array {
  let bin: string;
  try {
    bin = atob(text);
  } catch (e) {
    throw new HiloopError("the answer's base64 output is malformed", { code: "bad_answer", cause: e });
  }
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** FileInfo is what an upload wrote. */
export type { FileInfo };

/** Refuses a read of a directory with read, as the Python client does. */
export function notAFile(path: string): ConflictError {
  return new ConflictError(`${path} is a directory; use downloadDir`, { code: "path_conflict", status: 409 });
}
