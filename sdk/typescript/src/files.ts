// sb.files: files and directories in and out of a sandbox (PUT and GET
// /v1/sandboxes/{id}/files), through the exec path, as the image's own
// user. Single files need only fetch; uploadDir and downloadDir use the
// local file system (node:fs, which Node, Deno and Bun have).

import type { Sandbox } from "./client.js";
import { notAFile, readCapped, WAKE_WAIT, type BodyInit } from "./client.js";
import { ConflictError, ExtractError, HiloopError } from "./errors.js";
import { entryHeader, localParts, padded, TarReader } from "./tar.js";
import type { FileEntry, FileInfo, FileList } from "./types.js";

/** The media type of a directory's tar stream. */
export const TAR_MEDIA_TYPE = "application/x-tar";
/** read's and downloadDir's default cap on bytes: serve's default
 * --max-file-size (api.DefaultMaxFileBytes). */
export const MAX_FILE_BYTES = 1 << 30;
/** downloadDir's default cap on a directory's entries. */
export const MAX_ENTRIES = 100_000;
/** How long the server gives one file operation (api.FSTimeout), seconds. */
export const FS_TIMEOUT = 600;
/** Bytes an upload is given a second for, beyond the client's timeout, as
 * the server allows a body (docs/api.md, Rate limits). */
const UPLOAD_RATE = 16 << 10;

/** How downloadDir writes what it gets. */
export interface DownloadOptions {
  /** Write into an existing local directory, replacing the files the
   * stream names (false: local must not exist). */
  overwrite?: boolean;
  /** The most bytes of content written or skipped (1 GiB). */
  maxBytes?: number;
  /** The most entries (100,000). */
  maxEntries?: number;
  signal?: AbortSignal;
}

/** An open download: its response, whose body streams; the read is cut
 * when the server is silent for the client's timeout. */
export interface Download {
  response: Response;
  /** Whether it is a directory's tar stream. */
  isDir: boolean;
  /** The body, guarded by the silence deadline. */
  body: ReadableStream<Uint8Array>;
}

type NodeFS = typeof import("node:fs/promises");

async function nodeFS(): Promise<{ fs: NodeFS; path: typeof import("node:path"); os: typeof import("node:os"); constants: typeof import("node:fs").constants; openAsBlob: typeof import("node:fs").openAsBlob }> {
  const [fs, path, os, sync] = await Promise.all([import("node:fs/promises"), import("node:path"), import("node:os"), import("node:fs")]);
  return { fs, path, os, constants: sync.constants, openAsBlob: sync.openAsBlob };
}

function hex(n: number): string {
  return [...crypto.getRandomValues(new Uint8Array(n))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function conflict(name: string, what: string): ExtractError {
  return new ExtractError(`tar entry ${JSON.stringify(name)}: ${what}`, { code: "path_conflict" });
}

/** sb.files: files and directories in and out of the sandbox. */
export class Files {
  constructor(private readonly sb: Sandbox) {}

  private path(path: string, extra: Record<string, string> = {}): string {
    const q = new URLSearchParams({ path, ...extra });
    if (this.sb.client.wake) q.set("wake", "true");
    return this.sb.path("/files?" + q);
  }

  /** Writes text (UTF-8), bytes or a Blob (a file: Node's
   * fs.openAsBlob(path)) to path, atomically: a cut upload leaves the old
   * file whole; missing parent directories are made. Returns the path,
   * size and sha256 the server received. */
  write(path: string, data: string | Uint8Array | Blob, opts: { mode?: number; signal?: AbortSignal } = {}): Promise<FileInfo> {
    const extra: Record<string, string> = opts.mode !== undefined ? { mode: opts.mode.toString(8).padStart(4, "0") } : {};
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    return this.upload(this.path(path, extra), "application/octet-stream", body, opts.signal);
  }

  /** Extracts a tar stream (bytes or a Blob) into the directory at path,
   * made if missing; the image needs tar. */
  writeTar(path: string, tar: Uint8Array | Blob, opts: { signal?: AbortSignal } = {}): Promise<FileInfo> {
    return this.upload(this.path(path), TAR_MEDIA_TYPE, tar, opts.signal);
  }

  private async upload(path: string, contentType: string, body: Uint8Array | Blob, signal?: AbortSignal): Promise<FileInfo> {
    const c = this.sb.client;
    const size = body instanceof Blob ? body.size : body.length;
    return c.json<FileInfo>({
      method: "PUT", path, signal,
      // fetch sends a Blob's or an array's Content-Length, which the
      // server needs; both can be sent again for a retry.
      body: () => body as BodyInit,
      headers: { "Content-Type": contentType },
      timeout: c.timeout + (c.wake ? WAKE_WAIT : 0) + size / UPLOAD_RATE,
    });
  }

  /** Opens path for reading: a file's bytes, or a directory's tar stream.
   * The answer must start within the client's timeout (plus a wake's), and
   * a server silent that long midway cuts the body with an error. */
  async open(path: string, opts: { signal?: AbortSignal } = {}): Promise<Download> {
    const c = this.sb.client;
    const a = await c.request({ method: "GET", path: this.path(path), timeout: c.timeout + (c.wake ? WAKE_WAIT : 0), signal: opts.signal });
    a.done();
    const silent = () => new HiloopError(`GET ${path}: the server was silent for ${c.timeout}s`, { code: "timeout" });
    let timer = setTimeout(() => a.abort(silent()), c.timeout * 1000);
    const onAbort = () => a.abort(opts.signal!.reason);
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    const stop = () => {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
    };
    const src = a.response.body?.getReader();
    const want = Number(a.response.headers.get("content-length") ?? NaN);
    let got = 0;
    const body = new ReadableStream<Uint8Array>({
      async pull(ctl) {
        try {
          const { value, done } = src ? await src.read() : { value: undefined, done: true };
          clearTimeout(timer);
          if (done || !value) {
            stop();
            // A body cut short of its length is an error, never a short file.
            if (Number.isFinite(want) && got !== want) ctl.error(new HiloopError(`GET ${path}: the body ended after ${got} of ${want} bytes`, { code: "incomplete" }));
            else ctl.close();
            return;
          }
          timer = setTimeout(() => a.abort(silent()), c.timeout * 1000);
          got += value.length;
          ctl.enqueue(value);
        } catch (e) {
          stop();
          ctl.error(e);
        }
      },
      cancel(reason) {
        stop();
        return src?.cancel(reason);
      },
    });
    const isDir = (a.response.headers.get("content-type") ?? "").startsWith(TAR_MEDIA_TYPE);
    return { response: a.response, isDir, body };
  }

  /** Reads the file at path whole, into memory; a transfer that breaks
   * midway throws, never returns short. A file larger than maxBytes (1 GiB)
   * throws LimitError output_limit: readTo streams one. */
  async read(path: string, opts: { maxBytes?: number; signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const d = await this.open(path, opts);
    if (d.isDir) {
      await d.body.cancel();
      throw notAFile(path);
    }
    return readCapped(new Response(d.body), opts.maxBytes ?? MAX_FILE_BYTES, `the file ${path}`);
  }

  /** Reads the file at path as UTF-8 text (see read). */
  async readText(path: string, opts: { maxBytes?: number; signal?: AbortSignal } = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  /** Streams the file at path into out; returns the bytes copied. */
  async readTo(path: string, out: WritableStream<Uint8Array>, opts: { signal?: AbortSignal } = {}): Promise<number> {
    const d = await this.open(path, opts);
    if (d.isDir) {
      await d.body.cancel();
      throw notAFile(path);
    }
    let n = 0;
    await d.body.pipeThrough(new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, ctl) {
        n += chunk.length;
        ctl.enqueue(chunk);
      },
    })).pipeTo(out);
    return n;
  }

  /** Copies the local directory into the directory at path (made if
   * missing), as a tar stream; the image needs tar. Directories, regular
   * files and symbolic links travel (others are skipped); the tar names no
   * owner (uid and gid 0, no user or group names), so nothing of the local
   * accounts reaches the sandbox. */
  async uploadDir(local: string, path: string, opts: { signal?: AbortSignal } = {}): Promise<FileInfo> {
    const { fs, path: p, os, openAsBlob } = await nodeFS();
    const tmp = await fs.mkdtemp(p.join(os.tmpdir(), "hiloop-tar-"));
    try {
      const file = p.join(tmp, "dir.tar");
      const out = await fs.open(file, "wx", 0o600);
      try {
        await writeTree(fs, p, out, local, "");
        await out.write(new Uint8Array(1024)); // the end-of-archive blocks
      } finally {
        await out.close();
      }
      return await this.writeTar(path, await openAsBlob(file), opts);
    } finally {
      await fs.rm(tmp, { recursive: true, force: true });
    }
  }

  /**
   * Copies the directory at path into a new local directory, local (its
   * parents made if missing); an Error with code EEXIST if local exists.
   * It is written as a temporary directory .hiloop-<hex> beside local and
   * renamed into place once whole, so a failed download leaves nothing.
   *
   * With overwrite an existing local is written into instead: its other
   * files stay, a file the download names is replaced (renamed over, never
   * written through a link), and a failed download leaves what it wrote.
   *
   * What the sandbox sends is not trusted. Only directories and regular
   * files are written, each inside local: an entry naming a path outside,
   * or through a symbolic link (one already in local included), throws
   * ExtractError, as do a sparse file, a name written twice and a stream
   * that is not a whole tar. Links, devices and fifos are skipped. Modes
   * are the tar's permission bits less the umask, never setuid, setgid or
   * sticky. More than maxBytes of content or maxEntries entries throws
   * LimitError extract_limit.
   */
  async downloadDir(path: string, local: string, opts: DownloadOptions = {}): Promise<void> {
    const { fs, path: p, constants } = await nodeFS();
    const dest = p.resolve(local);
    const exists = await fs.lstat(dest).then(() => true, (e) => (e.code === "ENOENT" ? false : Promise.reject(e)));
    if (exists && !opts.overwrite) {
      throw Object.assign(new Error(`${local}: downloadDir writes a new directory (overwrite: true writes into an existing one)`), { code: "EEXIST" });
    }
    const d = await this.open(path, opts);
    if (!d.isDir) {
      await d.body.cancel();
      throw new ConflictError(`${path} is a file, not a directory`, { code: "path_conflict", status: 409 });
    }
    const r = new TarReader(d.body, opts.maxBytes ?? MAX_FILE_BYTES, opts.maxEntries ?? MAX_ENTRIES);
    try {
      if (exists) {
        await extract(fs, p, constants, r, dest, true);
        return;
      }
      await fs.mkdir(p.dirname(dest), { recursive: true });
      const tmp = p.join(p.dirname(dest), ".hiloop-" + hex(8));
      await fs.mkdir(tmp, 0o777);
      try {
        await extract(fs, p, constants, r, tmp, false);
        // A directory made at local meanwhile is not merged into.
        if (await fs.lstat(dest).then(() => true, () => false)) {
          throw Object.assign(new Error(`${local}: made while downloadDir wrote it`), { code: "EEXIST" });
        }
        await fs.rename(tmp, dest);
      } catch (e) {
        await fs.rm(tmp, { recursive: true, force: true });
        throw e;
      }
    } finally {
      await d.body.cancel().catch(() => {});
    }
  }

  /** Makes the file operation call op (GET .../fs/list and stat, POST
   * .../fs/remove, mkdir and rename), waking the sandbox unless the client
   * says not to; the server gives one operation up to FS_TIMEOUT. */
  private op<T>(method: string, op: string, query: Record<string, string>, payload: unknown, signal?: AbortSignal): Promise<T> {
    const c = this.sb.client;
    const q = new URLSearchParams(query);
    if (c.wake) q.set("wake", "true");
    const qs = q.toString();
    return c.json<T>({ method, path: this.sb.path("/fs/" + op + (qs ? "?" + qs : "")), payload, signal,
      timeout: FS_TIMEOUT + c.timeout + (c.wake ? WAKE_WAIT : 0) });
  }

  /** Lists the directory at path, or the one a symbolic link there points
   * to, sorted by name in byte order, without . and ..; truncated says it
   * holds more than the 10,000 entries answered. A path that is not a
   * directory is ConflictError path_conflict; none, NotFoundError
   * file_not_found. */
  list(path: string, opts: { signal?: AbortSignal } = {}): Promise<FileList> {
    return this.op<FileList>("GET", "list", { path }, undefined, opts.signal);
  }

  /** What is at path (a symbolic link itself, never what it points to);
   * nothing there is NotFoundError file_not_found (see exists). */
  stat(path: string, opts: { signal?: AbortSignal } = {}): Promise<FileEntry> {
    return this.op<FileEntry>("GET", "stat", { path }, undefined, opts.signal);
  }

  /** Whether anything (a dangling symbolic link too) is at path. Only
   * file_not_found is false: a sandbox not found (not_found), not running,
   * or any other failure throws. */
  async exists(path: string, opts: { signal?: AbortSignal } = {}): Promise<boolean> {
    try {
      await this.stat(path, opts);
      return true;
    } catch (e) {
      if (e instanceof HiloopError && e.code === "file_not_found") return false;
      throw e;
    }
  }

  /** Removes the file, symbolic link (never what it points to) or empty
   * directory at path; with recursive, a directory and everything in it. A
   * directory that is not empty without recursive is ConflictError
   * directory_not_empty, and nothing is removed. */
  async remove(path: string, opts: { recursive?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    await this.op<void>("POST", "remove", {}, { path, recursive: opts.recursive ?? false }, opts.signal);
  }

  /** Makes the directory at path and its missing parents (mkdir -p) and
   * answers its entry; one that exists is no error. A file on the way is
   * ConflictError path_conflict. */
  mkdir(path: string, opts: { signal?: AbortSignal } = {}): Promise<FileEntry> {
    return this.op<FileEntry>("POST", "mkdir", {}, { path }, opts.signal);
  }

  /** Renames from to to, making to's missing parents, and answers to's
   * entry. A to that exists is ConflictError path_conflict unless
   * overwrite, which replaces a file, a link, or an empty directory when
   * from is one. */
  rename(from: string, to: string, opts: { overwrite?: boolean; signal?: AbortSignal } = {}): Promise<FileEntry> {
    return this.op<FileEntry>("POST", "rename", {}, { from, to, overwrite: opts.overwrite ?? false }, opts.signal);
  }
}

/** Writes the tar entries of the directory dir (named prefix in the tar)
 * to out, in name order. */
async function writeTree(fs: NodeFS, p: typeof import("node:path"), out: import("node:fs/promises").FileHandle, dir: string, prefix: string): Promise<void> {
  for (const name of (await fs.readdir(dir)).sort()) {
    const full = p.join(dir, name);
    const tarName = prefix + name;
    const st = await fs.lstat(full);
    if (st.isDirectory()) {
      await out.write(entryHeader(tarName + "/", "5", st.mode, 0));
      await writeTree(fs, p, out, full, tarName + "/");
    } else if (st.isSymbolicLink()) {
      await out.write(entryHeader(tarName, "2", st.mode, 0, await fs.readlink(full)));
    } else if (st.isFile()) {
      await out.write(entryHeader(tarName, "0", st.mode, st.size));
      // Exactly the size the header declared, whatever the file does meanwhile.
      const f = await fs.open(full, "r");
      try {
        const buf = new Uint8Array(1 << 20);
        let left = st.size;
        while (left > 0) {
          const { bytesRead } = await f.read(buf, 0, Math.min(buf.length, left));
          if (bytesRead === 0) break;
          await out.write(buf.subarray(0, bytesRead));
          left -= bytesRead;
        }
        if (left > 0) await out.write(new Uint8Array(left));
      } finally {
        await f.close();
      }
      await out.write(new Uint8Array((512 - (st.size % 512)) % 512));
    }
  }
}

/** Writes the directories and regular files of r into the directory root.
 * Each directory on an entry's way is checked with lstat (a link or a file
 * there is a conflict) or made; a file is made with O_EXCL and O_NOFOLLOW,
 * and with overwrite beside its place and renamed over it. */
async function extract(fs: NodeFS, p: typeof import("node:path"), constants: typeof import("node:fs").constants,
  r: TarReader, root: string, overwrite: boolean): Promise<void> {
  const known = new Set<string>([""]);
  const dirOf = async (parts: string[], name: string, mode: number): Promise<void> => {
    let rel = "";
    for (let i = 0; i < parts.length; i++) {
      rel = rel ? rel + "/" + parts[i] : parts[i]!;
      if (known.has(rel)) continue;
      const full = p.join(root, rel);
      const last = i === parts.length - 1;
      try {
        await fs.mkdir(full, last ? mode : 0o777);
      } catch (e) {
        if ((e as { code?: string }).code !== "EEXIST") throw e;
        const st = await fs.lstat(full);
        if (!st.isDirectory()) throw conflict(name, `${JSON.stringify(parts[i])} is a symbolic link or not a directory`);
      }
      known.add(rel);
    }
  };
  const create = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | (constants.O_NOFOLLOW ?? 0);
  for (;;) {
    const e = await r.next();
    if (e === null) return;
    if (e.sparse) throw new ExtractError(`tar entry ${JSON.stringify(e.name)} is a sparse file, which downloadDir does not write`, { code: "sparse_entry" });
    if (e.kind === "other") continue;
    const parts = localParts(e.name);
    if (parts.length === 0) continue;
    if (e.kind === "dir") {
      await dirOf(parts.slice(0, -1), e.name, 0o777);
      await dirOf(parts, e.name, (e.mode & 0o777) | 0o700);
      continue;
    }
    await dirOf(parts.slice(0, -1), e.name, 0o777);
    const rel = parts.join("/");
    if (known.has(rel)) throw conflict(e.name, "a directory is in its place");
    const target = p.join(root, rel);
    // Over an existing path, write beside it and rename over it: the old
    // entry (a file, a hard link, a symbolic link) is replaced, not written
    // through, and the new file gets the mode the umask allows.
    const tmp = overwrite ? p.join(p.dirname(target), ".hiloop-" + hex(8)) : target;
    let f: import("node:fs/promises").FileHandle;
    try {
      f = await fs.open(tmp, create, e.mode & 0o777);
    } catch (err) {
      if ((err as { code?: string }).code === "EEXIST" || (err as { code?: string }).code === "ELOOP") {
        throw conflict(e.name, "already written (a tar lists it twice, or a directory of its name)");
      }
      throw err;
    }
    try {
      try {
        for (let b = await r.read(); b.length > 0; b = await r.read()) await f.write(b);
      } finally {
        await f.close();
      }
      if (overwrite) {
        try {
          await fs.rename(tmp, target);
        } catch (err) {
          const code = (err as { code?: string }).code;
          if (code === "EISDIR" || code === "ENOTEMPTY" || code === "EEXIST" || code === "ENOTDIR") throw conflict(e.name, "a directory is in its place");
          throw err;
        }
      }
    } catch (err) {
      if (overwrite) await fs.rm(tmp, { force: true });
      throw err;
    }
  }
}
