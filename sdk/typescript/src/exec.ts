// The exec stream: GET /v1/sandboxes/{id}/exec over the runtime's global
// WebSocket, subprotocol hiloop.exec.v1 (docs/api.md, Streaming). The argv
// travels in the first message, so it stays out of proxy and access logs;
// every other message is binary, its first byte the channel.

import type { Sandbox } from "./client.js";
import { concat, errorOf, sleep, WAKE_WAIT } from "./client.js";
import { errorFor, HiloopError, LimitError, StreamLostError } from "./errors.js";
import type { ExitFrame } from "./types.js";

/** The exec stream's WebSocket subprotocol. */
export const EXEC_SUBPROTOCOL = "hiloop.exec.v1";
/** The channels: the first byte of every binary message. */
export const CHAN_STDIN = 0, CHAN_STDOUT = 1, CHAN_STDERR = 2, CHAN_EXIT = 3, CHAN_RESIZE = 4, CHAN_CLOSE_IN = 255;
/** exec's default cap on each of stdout and stderr it collects. */
export const MAX_OUTPUT = 16 << 20;
/** Seconds the upgrade may take (plus WAKE_WAIT when it may wake). */
const HANDSHAKE_WAIT = 30;
/** Seconds past the command's timeout the exit status may take. */
const EXEC_MARGIN = 60;
/** The server's longest command (api.MaxExecTimeout), seconds. */
const MAX_EXEC_TIMEOUT = 24 * 3600;
/** The most stdin a session queues in the WebSocket before it waits. */
const STDIN_BUFFER = 1 << 20;
/** The size of each stdin message (the server takes 1 MiB at most). */
const STDIN_CHUNK = 32 << 10;

/** How a command ended: its exit code (128+n for a death by signal n, with
 * signal naming it), or timedOut with exitCode undefined. */
export class CommandResult {
  private out?: string;
  private err?: string;

  constructor(
    readonly exitCode: number | undefined,
    readonly stdoutBytes: Uint8Array,
    readonly stderrBytes: Uint8Array,
    readonly timedOut = false,
    readonly signal = "",
    /** run only: stdout passed 1 MiB and the rest was dropped. */
    readonly stdoutTruncated = false,
    readonly stderrTruncated = false,
    /** run only: how the server sent the output, utf-8 or base64 (for
     * output that is not UTF-8); the bytes are the command's either way. */
    readonly encoding: "utf-8" | "base64" = "utf-8",
  ) {}

  /** A result of text, as run answers. */
  static fromText(exitCode: number | undefined, stdout: string, stderr: string, timedOut: boolean, signal: string,
    stdoutTruncated: boolean, stderrTruncated: boolean): CommandResult {
    const enc = new TextEncoder();
    const r = new CommandResult(exitCode, enc.encode(stdout), enc.encode(stderr), timedOut, signal, stdoutTruncated, stderrTruncated);
    r.out = stdout;
    r.err = stderr;
    return r;
  }

  /** stdout as UTF-8 text. */
  get stdout(): string {
    return (this.out ??= new TextDecoder().decode(this.stdoutBytes));
  }

  /** stderr as UTF-8 text. */
  get stderr(): string {
    return (this.err ??= new TextDecoder().decode(this.stderrBytes));
  }

  /** Whether the command exited 0. */
  get ok(): boolean {
    return this.exitCode === 0;
  }
}

/** What a command's stdin is. */
export type Stdin = string | Uint8Array | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** How exec runs a command. */
export interface ExecOptions {
  /** Copied to the command, then closed. With openExec, true opens stdin
   * for ExecSession.write. Without it the command gets no stdin. */
  stdin?: Stdin | true;
  /** A terminal (stdin is then opened, true when not given); stdout and
   * stderr come merged as stdout. */
  tty?: boolean;
  /** The terminal's first size, [width, height] (tty only). */
  size?: readonly [number, number];
  /** Seconds the command may run (the server's 24 h); past them the result
   * says timedOut. */
  timeout?: number;
  /** Variables added to the command's environment, over the container's:
   * passed as they are, never read by a shell (the image needs sh). */
  env?: Record<string, string>;
  /** The absolute directory the command runs in (the container's own
   * without it); a missing one is NotFoundError file_not_found, with field
   * cwd, and the command does not run. */
  cwd?: string;
  /** Each chunk of stdout as it comes; nothing is collected then. */
  onStdout?: (chunk: Uint8Array) => void;
  /** Each chunk of stderr as it comes; nothing is collected then. */
  onStderr?: (chunk: Uint8Array) => void;
  /** The most of each of stdout and stderr collected without onStdout and
   * onStderr (16 MiB); past it LimitError output_limit and the session is
   * closed. */
  maxOutput?: number;
  /** Closes the session: the command's fate is then unknown. */
  signal?: AbortSignal;
}

/** The subset of the global WebSocket the session uses. */
interface Socket {
  binaryType: string;
  readyState: number;
  bufferedAmount: number;
  protocol: string;
  send(data: string | ArrayBufferView | ArrayBuffer): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: string, fn: (e: any) => void, opts?: { once?: boolean }): void;
}

/** What a failed upgrade answered, where the runtime lets it be seen. */
interface Refusal {
  status?: number;
  headers: Headers;
  body: Uint8Array[];
}

/** A dispatcher that hands every request to the runtime's own (Node's
 * undici) and notes the status, headers and body of an answer other than
 * the upgrade, which the WebSocket API does not show: so a refusal before
 * the upgrade is the API's own error, with its code. Undefined where the
 * runtime's WebSocket does not go through undici. */
function refusalRecorder(refusal: Refusal): object | undefined {
  const global = (globalThis as Record<symbol, unknown>)[Symbol.for("undici.globalDispatcher.1")] as
    { dispatch(opts: unknown, handler: object): boolean } | undefined;
  if (!global || typeof global.dispatch !== "function") return undefined;
  const note = (status: number, headers: unknown) => {
    if (status === 101) return;
    refusal.status = status;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) refusal.headers.append(String(headers[i]), String(headers[i + 1]));
    } else if (headers && typeof headers === "object") {
      for (const [k, v] of Object.entries(headers)) refusal.headers.append(k, String(v));
    }
  };
  const keep = (chunk: unknown) => {
    if (refusal.status !== undefined && refusal.body.reduce((n, b) => n + b.length, 0) < 64 << 10 && chunk instanceof Uint8Array) {
      refusal.body.push(new Uint8Array(chunk));
    }
  };
  return {
    dispatch(opts: unknown, handler: object): boolean {
      const h = new Proxy(handler, {
        get(target, prop) {
          const v = Reflect.get(target, prop, target);
          if (typeof v !== "function") return v;
          switch (prop) {
            case "onHeaders": // undici 6: (status, rawHeaders, resume, statusText)
              return (status: number, headers: unknown, ...rest: unknown[]) => (note(status, headers), v.call(target, status, headers, ...rest));
            case "onResponseStart": // undici 7: (controller, status, headers, statusText)
              return (c: unknown, status: number, headers: unknown, ...rest: unknown[]) => (note(status, headers), v.call(target, c, status, headers, ...rest));
            case "onData":
              return (chunk: unknown) => (keep(chunk), v.call(target, chunk));
            case "onResponseData":
              return (c: unknown, chunk: unknown) => (keep(chunk), v.call(target, c, chunk));
          }
          return v.bind(target);
        },
      });
      return global.dispatch(opts, h);
    },
  };
}

/** An open exec session: the command runs; write to its stdin, resize its
 * terminal, and wait for how it ends. */
export class ExecSession {
  private readonly result: Promise<CommandResult>;
  private stdinOpen: boolean;

  /** @internal */
  constructor(private readonly ws: Socket, result: Promise<CommandResult>, stdin: boolean) {
    this.result = result;
    this.stdinOpen = stdin;
    // A session nobody waits for must not fail the process with an
    // unhandled rejection; wait() still sees the outcome.
    result.catch(() => {});
  }

  /** Writes data to the command's stdin (the session must have been opened
   * with stdin), waiting while the WebSocket holds more than 1 MiB unsent. */
  async write(data: string | Uint8Array): Promise<void> {
    if (!this.stdinOpen) throw new HiloopError("the session's stdin is not open (pass stdin: true)", { code: "stdin_closed" });
    const b = typeof data === "string" ? new TextEncoder().encode(data) : data;
    for (let at = 0; at < b.length; at += STDIN_CHUNK) {
      // The WebSocket API tells no drain; bufferedAmount is all it shows.
      while (this.ws.bufferedAmount > STDIN_BUFFER && this.ws.readyState === 1) await sleep(0.01);
      this.send(CHAN_STDIN, b.subarray(at, at + STDIN_CHUNK));
    }
  }

  /** Ends the command's stdin. */
  closeStdin(): void {
    if (!this.stdinOpen) return;
    this.stdinOpen = false;
    this.send(CHAN_CLOSE_IN, Uint8Array.of(CHAN_STDIN));
  }

  /** Tells the command's terminal its new size (tty sessions only). */
  resize(width: number, height: number): void {
    this.send(CHAN_RESIZE, new TextEncoder().encode(JSON.stringify({ width, height })));
  }

  /** Closes the session; wait() then throws StreamLostError unless the exit
   * status came first. A command that never writes again may go on
   * running (Kubernetes cannot signal an exec'd process). */
  close(): void {
    this.ws.close(1000);
  }

  /** How the command ended. */
  wait(): Promise<CommandResult> {
    return this.result;
  }

  private send(ch: number, payload: Uint8Array): void {
    if (this.ws.readyState !== 1) return; // the session ended; wait() says how
    const msg = new Uint8Array(payload.length + 1);
    msg[0] = ch;
    msg.set(payload, 1);
    this.ws.send(msg);
  }
}

/** The HTTP status an error code of an exit frame has outside a stream,
 * for its family. */
function streamStatus(code: string): number {
  return ({ session_ended: 409, exec_failed: 502, cluster_unavailable: 503, invalid_frame: 400, invalid_field: 400,
    invalid_env: 400, invalid_path: 400, file_not_found: 404, path_conflict: 409, shell_unavailable: 422 } as Record<string, number>)[code] ?? 500;
}

/** The result an exit frame tells, or the error it carries. */
function exitResult(payload: Uint8Array, out: Uint8Array, errs: Uint8Array): CommandResult {
  let f: ExitFrame | undefined;
  try {
    f = JSON.parse(new TextDecoder().decode(payload));
  } catch {
    f = undefined;
  }
  if (!f || typeof f !== "object" || Array.isArray(f)) throw new StreamLostError("the exit frame is not a JSON object", { code: "stream_lost" });
  if (f.error) {
    const e = f.error;
    if (typeof e !== "object") throw new StreamLostError("the exit frame's error is not an object", { code: "stream_lost" });
    const code = String(e.code ?? "");
    if (code === "exec_timeout") return new CommandResult(undefined, out, errs, true);
    throw errorFor(streamStatus(code), String(e.message ?? ""), { code, requestId: String(e.request_id ?? ""), field: String(e.field ?? "") });
  }
  if (typeof f.exit_code !== "number" || !Number.isInteger(f.exit_code)) {
    throw new StreamLostError("the exit frame carried no exit code", { code: "stream_lost" });
  }
  return new CommandResult(f.exit_code, out, errs, false, typeof f.signal === "string" ? f.signal : "");
}

/** Opens the WebSocket of url, resolving once it is open; a refused
 * upgrade rejects with the API's error where the runtime shows it, else
 * with StreamLostError. */
function connect(url: string, token: string, seconds: number, signal?: AbortSignal): Promise<{ ws: Socket; refusal?: Refusal }> {
  const WS = (globalThis as { WebSocket?: new (url: string, init: unknown) => Socket }).WebSocket;
  if (!WS) {
    return Promise.reject(new HiloopError("this runtime has no global WebSocket (Node 22 or later, or node --experimental-websocket)", { code: "websocket_unavailable" }));
  }
  const refusal: Refusal = { headers: new Headers(), body: [] };
  const dispatcher = refusalRecorder(refusal);
  let ws: Socket;
  try {
    // Node (undici), Deno and Bun take headers in the second argument; a
    // browser's WebSocket cannot send the key at all.
    ws = new WS(url, { protocols: [EXEC_SUBPROTOCOL], headers: { Authorization: "Bearer " + token }, ...(dispatcher ? { dispatcher } : {}) });
  } catch (e) {
    return Promise.reject(new HiloopError("this runtime's WebSocket cannot send the API key (a browser's cannot)", { code: "websocket_unavailable", cause: e }));
  }
  ws.binaryType = "arraybuffer";
  return new Promise((resolve, reject) => {
    let settled = false;
    const settle = (f: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", abort);
      f();
    };
    const timer = setTimeout(() => settle(() => {
      ws.close();
      reject(new StreamLostError(`the exec stream was not opened within ${seconds}s`, { code: "stream_lost" }));
    }), seconds * 1000);
    const abort = () => settle(() => {
      ws.close();
      reject(signal!.reason);
    });
    signal?.addEventListener("abort", abort, { once: true });
    ws.addEventListener("open", () => settle(() => {
      if (ws.protocol !== EXEC_SUBPROTOCOL) {
        ws.close();
        reject(new StreamLostError(`the server chose subprotocol ${JSON.stringify(ws.protocol)}, not ${EXEC_SUBPROTOCOL}`, { code: "stream_lost" }));
        return;
      }
      resolve({ ws });
    }), { once: true });
    const failed = () => settle(() => {
      if (refusal.status !== undefined && refusal.status >= 300) {
        const body = new TextDecoder().decode(concat(refusal.body));
        reject(errorOf(refusal.status, refusal.headers, body));
        return;
      }
      reject(new StreamLostError("the exec stream ended before it began (a refused upgrade, whose answer this runtime does not show, or a lost connection)", { code: "stream_lost" }));
    });
    ws.addEventListener("error", failed, { once: true });
    ws.addEventListener("close", failed, { once: true });
  });
}

/** Opens an exec session of sb running argv: connects (retrying a refusal
 * with Retry-After, as every call does), sends the command and, for a
 * stdin given as data, feeds it. */
export async function openExec(sb: Sandbox, argv: string[], opts: ExecOptions): Promise<ExecSession> {
  const c = sb.client;
  const stdin = opts.stdin ?? (opts.tty ? true : undefined);
  const q = new URLSearchParams();
  if (stdin !== undefined) q.set("stdin", "true");
  if (opts.tty) q.set("tty", "true");
  if (opts.timeout !== undefined) q.set("timeout", `${Math.round(opts.timeout * 1000)}ms`);
  let handshake = HANDSHAKE_WAIT;
  if (c.wake) {
    q.set("wake", "true");
    handshake += WAKE_WAIT;
  }
  const base = new URL(c.url + sb.path("/exec"));
  base.protocol = base.protocol === "https:" ? "wss:" : "ws:";
  const qs = q.toString();
  const url = base.toString() + (qs ? "?" + qs : "");
  let ws: Socket;
  for (let attempt = 0; ; attempt++) {
    try {
      ({ ws } = await connect(url, c.token, handshake, opts.signal));
      break;
    } catch (e) {
      if (!(e instanceof HiloopError) || e.retryAfter === undefined || attempt >= c.maxRetries) throw e;
      await sleep(Math.min(e.retryAfter, 60), opts.signal);
    }
  }
  const result = session(ws, opts);
  // The environment, which may hold credentials, travels with the argv
  // in the first message, out of the URL and the access logs.
  const first: Record<string, unknown> = { command: argv };
  if (opts.env !== undefined) first["env"] = opts.env;
  if (opts.cwd !== undefined) first["cwd"] = opts.cwd;
  ws.send(JSON.stringify(first));
  const s = new ExecSession(ws, result, stdin !== undefined);
  if (opts.tty && opts.size) s.resize(opts.size[0], opts.size[1]);
  if (stdin !== undefined && stdin !== true) feed(s, stdin).catch(() => s.close());
  return s;
}

/** Copies stdin to the session, then closes it. */
async function feed(s: ExecSession, stdin: Stdin): Promise<void> {
  if (typeof stdin === "string" || stdin instanceof Uint8Array) {
    await s.write(stdin);
  } else {
    const src = stdin instanceof Blob ? stdin.stream() : stdin;
    for await (const chunk of src as AsyncIterable<Uint8Array>) await s.write(chunk);
  }
  s.closeStdin();
}

/** The outcome of the open session on ws: the exit frame's result, or the
 * error of a stream that broke, stalled or was refused midway. */
function session(ws: Socket, opts: ExecOptions): Promise<CommandResult> {
  const max = opts.maxOutput ?? MAX_OUTPUT;
  const out: Uint8Array[] = [], errs: Uint8Array[] = [];
  let nout = 0, nerr = 0;
  const seconds = (opts.timeout ?? MAX_EXEC_TIMEOUT) + EXEC_MARGIN;
  return new Promise((resolve, reject) => {
    let settled = false;
    let late = false;
    const settle = (f: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", abort);
      ws.close(1000);
      f();
    };
    const timer = setTimeout(() => {
      late = true;
      settle(() => reject(new StreamLostError(`the exec stream ended without an exit status: none within the command's timeout and ${EXEC_MARGIN}s`, { code: "stream_lost" })));
    }, Math.min(seconds * 1000, 2 ** 31 - 1));
    const abort = () => settle(() => reject(opts.signal!.reason));
    opts.signal?.addEventListener("abort", abort, { once: true });
    const collect = (buf: Uint8Array[], n: number, b: Uint8Array, name: string): number => {
      if (n + b.length > max) {
        throw new LimitError(`the command's ${name} passed maxOutput (${max} bytes); pass on${name === "stdout" ? "Stdout" : "Stderr"} to take more`, { code: "output_limit" });
      }
      buf.push(b);
      return n + b.length;
    };
    ws.addEventListener("message", (e: { data: unknown }) => {
      if (settled || !(e.data instanceof ArrayBuffer) || e.data.byteLength === 0) return;
      const msg = new Uint8Array(e.data);
      const payload = msg.subarray(1);
      try {
        switch (msg[0]) {
          case CHAN_STDOUT:
            if (opts.onStdout) opts.onStdout(payload);
            else nout = collect(out, nout, payload, "stdout");
            break;
          case CHAN_STDERR:
            if (opts.onStderr) opts.onStderr(payload);
            else nerr = collect(errs, nerr, payload, "stderr");
            break;
          case CHAN_EXIT: {
            const r = exitResult(payload, concat(out, nout), concat(errs, nerr));
            settle(() => resolve(r));
          }
        }
      } catch (err) {
        settle(() => reject(err));
      }
    });
    ws.addEventListener("close", (e: { code?: number; reason?: string }) => settle(() => {
      if (late) return;
      reject(new StreamLostError(`the exec stream ended without an exit status (close ${e.code ?? "?"}${e.reason ? ": " + e.reason : ""})`, { code: "stream_lost" }));
    }));
  });
}
