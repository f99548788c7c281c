// sb.processes: background processes (POST /v1/sandboxes/{id}/processes),
// commands started detached that outlive the call that started them. Their
// output (stdout and stderr together) is read from an offset, following
// it as it comes, and read again from where a cut left it.

import type { Command, Sandbox } from "./client.js";
import { argv, sleep, WAKE_WAIT } from "./client.js";
import { HiloopError } from "./errors.js";
import type { ProcessInfo } from "./types.js";

/** The header of an output answer that says the offset its body begins at. */
export const OUTPUT_OFFSET_HEADER = "Hiloop-Output-Offset";
/** The most bytes one writeStdin sends (api.MaxProcessStdin). */
export const MAX_PROCESS_STDIN = 64 << 10;
/** The signals a process may be sent. */
export type ProcessSignal = "TERM" | "KILL" | "INT" | "HUP" | "QUIT" | "USR1" | "USR2" | "STOP" | "CONT";

/** How many times in a row attach tries again without reading a byte
 * before it gives the last error. */
const ATTACH_TRIES = 5;

/** sb.processes: start, list and get background processes. */
export class Processes {
  constructor(private readonly sb: Sandbox) {}

  /** Starts cmd detached in the sandbox (an argv as is; a string through
   * sh -c) and returns it running. env is added to its environment and
   * cwd is the absolute directory it starts in, exactly as given; a cwd
   * the sandbox lacks is a NotFoundError (code file_not_found). A sandbox
   * stopped for idleness is woken first, unless the client says not to. */
  async start(cmd: Command, opts: { env?: Record<string, string>; cwd?: string; signal?: AbortSignal } = {}): Promise<Process> {
    const c = this.sb.client;
    const payload: Record<string, unknown> = { command: argv(cmd) };
    if (opts.env !== undefined) payload["env"] = opts.env;
    if (opts.cwd !== undefined) payload["cwd"] = opts.cwd;
    const info = await c.json<ProcessInfo>({ method: "POST", path: this.sb.path("/processes" + (c.wake ? "?wake=true" : "")),
      payload, timeout: c.timeout + (c.wake ? WAKE_WAIT : 0), signal: opts.signal });
    return new Process(this.sb, info);
  }

  /** The sandbox's processes, newest first. */
  async list(opts: { signal?: AbortSignal } = {}): Promise<Process[]> {
    const r = await this.sb.client.json<{ items: ProcessInfo[] }>({ method: "GET", path: this.sb.path("/processes"), signal: opts.signal });
    return r.items.map((p) => new Process(this.sb, p));
  }

  /** The process id; NotFoundError not_found for an unknown one. */
  async get(id: string, opts: { signal?: AbortSignal } = {}): Promise<Process> {
    return new Process(this.sb, await this.sb.client.json<ProcessInfo>({ method: "GET", path: processPath(this.sb, id), signal: opts.signal }));
  }
}

function processPath(sb: Sandbox, id: string, rest = ""): string {
  return sb.path("/processes/" + encodeURIComponent(id) + rest);
}

/** A process's output from an offset, as it comes: iterate it for its
 * chunks. offset is the offset of the next byte, where to attach again
 * after a cut; complete says the body ended whole (after a follow: the
 * process ended and all its output was read). */
export class ProcessOutput implements AsyncIterable<Uint8Array> {
  /** The offset of the next byte: the answer's Hiloop-Output-Offset plus
   * the bytes read. */
  offset: number;
  /** Whether the body ended whole. */
  complete = false;

  constructor(readonly response: Response, offset: number, private readonly stop: () => void) {
    this.offset = offset;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array, void, undefined> {
    const r = this.response.body?.getReader();
    try {
      for (;;) {
        const { value, done } = r ? await r.read() : { value: undefined, done: true };
        if (done) break;
        this.offset += value.length;
        yield value;
      }
      this.complete = true;
    } finally {
      this.stop();
      await r?.cancel().catch(() => {});
    }
  }

  /** Stops reading. */
  async cancel(): Promise<void> {
    this.stop();
    await this.response.body?.cancel().catch(() => {});
  }
}

/** A background process. */
export class Process {
  /** The process as the API last showed it. */
  data: ProcessInfo;
  readonly id: string;

  constructor(readonly sandbox: Sandbox, data: ProcessInfo) {
    this.data = data;
    this.id = data.id;
  }

  /** running, exited or ended, as the API last showed it. */
  get state(): ProcessInfo["state"] {
    return this.data.state;
  }

  /** Its exit code once it exited: the exit status, or 128 plus the
   * signal's number (a TERM is 143). */
  get exitCode(): number | undefined {
    return this.data.exit_code;
  }

  toString(): string {
    return `Process(${this.id}, ${this.state})`;
  }

  private path(rest = ""): string {
    return processPath(this.sandbox, this.id, rest);
  }

  private async set(p: Promise<ProcessInfo>): Promise<this> {
    this.data = await p;
    return this;
  }

  /** Reads the process again; the sandbox is asked how it stands. */
  refresh(opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.set(this.sandbox.client.json<ProcessInfo>({ method: "GET", path: this.path(), signal: opts.signal }));
  }

  /** Opens its output from offset (0). Without follow the body is what it
   * has written so far; with follow it goes on as the process writes and
   * ends once it ended. An offset older than what the sandbox keeps, or
   * the output of an ended process, is HiloopError output_gone (410). A
   * follow has no deadline of the client's: a process may be silent for
   * long; signal ends it. */
  async output(opts: { offset?: number; follow?: boolean; signal?: AbortSignal } = {}): Promise<ProcessOutput> {
    const offset = opts.offset ?? 0;
    const q = new URLSearchParams({ offset: String(offset) });
    if (opts.follow) q.set("follow", "true");
    const a = await this.sandbox.client.request({ method: "GET", path: this.path("/output?" + q), signal: opts.signal });
    // The deadline was for the answer's start; the body is the process's.
    a.done();
    const onAbort = () => a.abort(opts.signal!.reason);
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    const start = Number(a.response.headers.get(OUTPUT_OFFSET_HEADER) ?? NaN);
    return new ProcessOutput(a.response, Number.isSafeInteger(start) && start >= 0 ? start : offset,
      () => opts.signal?.removeEventListener("abort", onAbort));
  }

  /** Follows its output from offset (0) to the process's end, yielding
   * each chunk as it comes; after a cut it attaches again from the next
   * offset, so no byte is lost or repeated. Ends once the process ended
   * (refresh then shows how); throws what the server refuses (output_gone
   * when the reader fell behind what is kept) and the last error after a
   * few tries that read nothing. */
  async *attach(opts: { offset?: number; signal?: AbortSignal } = {}): AsyncGenerator<Uint8Array, void, undefined> {
    let offset = opts.offset ?? 0;
    let tries = 0;
    for (;;) {
      let out: ProcessOutput | undefined;
      try {
        out = await this.output({ offset, follow: true, signal: opts.signal });
        offset = out.offset;
        for await (const chunk of out) {
          offset = out.offset;
          tries = 0;
          yield chunk;
        }
        if (out.complete) return;
      } catch (e) {
        // The API's refusal is final; a cut body or connection is not.
        if (opts.signal?.aborted || (e instanceof HiloopError && e.status !== 0 && e.status !== 502 && e.status !== 503 && e.status !== 504)) throw e;
        if (out) offset = out.offset;
        if (++tries >= ATTACH_TRIES) throw e;
        await sleep(0.2 * tries, opts.signal);
      }
    }
  }

  /** Writes data (at most 64 KiB) to its stdin; with close, stdin is
   * closed after, so the process reads end of file. A process that
   * finished is ConflictError process_not_running. */
  async writeStdin(data: string | Uint8Array, opts: { close?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.sandbox.client.json<void>({ method: "POST", path: this.path("/stdin" + (opts.close ? "?close=true" : "")),
      body: () => body, headers: { "Content-Type": "application/octet-stream" }, signal: opts.signal });
  }

  /** Closes its stdin: the process reads end of file. */
  closeStdin(opts: { signal?: AbortSignal } = {}): Promise<void> {
    return this.writeStdin(new Uint8Array(), { close: true, signal: opts.signal });
  }

  /** Sends sig to its whole process group. */
  signal(sig: ProcessSignal, opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.set(this.sandbox.client.json<ProcessInfo>({ method: "POST", path: this.path("/signal"), payload: { signal: sig }, signal: opts.signal }));
  }

  /** Sends KILL to its process group; wait then shows its end (exit code
   * 137). */
  kill(opts: { signal?: AbortSignal } = {}): Promise<this> {
    return this.set(this.sandbox.client.json<ProcessInfo>({ method: "DELETE", path: this.path(), signal: opts.signal }));
  }

  /** Waits until the process exited (exitCode is then its exact exit code)
   * or ended, and returns it. It follows the output from where the
   * process stands, reading without keeping it, and asks again after a
   * cut. */
  async wait(opts: { signal?: AbortSignal } = {}): Promise<this> {
    for (;;) {
      await this.refresh(opts);
      if (this.state !== "running") return this;
      try {
        const out = await this.output({ offset: this.data.output_bytes ?? 0, follow: true, signal: opts.signal });
        for await (const _ of out) {
          // The bytes are not kept: only the body's end matters.
        }
        if (out.complete) continue;
      } catch (e) {
        if (opts.signal?.aborted) throw e;
        // output_gone or process_not_running: it moved on or finished;
        // other refusals are final.
        if (e instanceof HiloopError && e.status !== 0 && e.code !== "output_gone" && e.code !== "process_not_running" &&
          e.status < 500) throw e;
      }
      await sleep(1, opts.signal);
    }
  }
}
