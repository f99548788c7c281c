// Tar streams both ways. The reader takes a directory's tar from a sandbox,
// which is not trusted: ustar, GNU and PAX headers read strictly and in
// linear time, at most MAX_META bytes of a header held, every byte counted
// as it is read, sparse files told apart so they can be refused. The
// writer makes the tar of an upload, naming no owner.

import { ExtractError, LimitError } from "./errors.js";

export const BLOCK = 512;
/** The largest PAX or GNU long-name header read (archive/tar's limit too). */
export const MAX_META = 1 << 20;
/** How many extension headers may precede one entry. */
const MAX_META_RUN = 16;
const CHUNK = 1 << 20;
/** A tar entry's name is at most MAX_NAME bytes and MAX_DEPTH directories
 * deep, as in the Go SDK (api.MaxPathBytes, api.MaxTarDepth). */
export const MAX_NAME = 4096;
export const MAX_DEPTH = 128;

function bad(msg: string): ExtractError {
  return new ExtractError(msg, { code: "invalid_tar" });
}

/** One entry of a stream. */
export interface Entry {
  name: string;
  kind: "file" | "dir" | "other";
  mode: number;
  size: number;
  sparse: boolean;
}

const latin = new TextDecoder("utf-8");

function str(field: Uint8Array): string {
  const z = field.indexOf(0);
  return latin.decode(z < 0 ? field : field.subarray(0, z));
}

/** A numeric header field: octal digits, or base-256 for a large one. */
function num(field: Uint8Array, what: string): number {
  if (field.length && field[0]! & 0x80) {
    if (field[0] === 0xff) throw bad(`negative ${what} in a tar header`);
    let n = field[0]! & 0x7f;
    for (const b of field.subarray(1)) {
      n = n * 256 + b;
      if (n > Number.MAX_SAFE_INTEGER) throw bad(`${what} in a tar header is too large`);
    }
    return n;
  }
  const s = str(field).replace(/^ +| +$/g, "");
  if (!/^[0-7]*$/.test(s)) throw bad(`${what} ${JSON.stringify(s)} in a tar header is not octal`);
  return s ? parseInt(s, 8) : 0;
}

/** The records "<length> <key>=<value>\n" of a PAX header. */
function pax(data: Uint8Array): Map<string, string> {
  const out = new Map<string, string>();
  let pos = 0;
  while (pos < data.length) {
    let sp = pos;
    while (sp < data.length && sp < pos + 20 && data[sp] !== 0x20) sp++;
    const digits = latin.decode(data.subarray(pos, sp));
    if (sp >= data.length || data[sp] !== 0x20 || !/^[0-9]+$/.test(digits)) throw bad("a PAX record without its length");
    const end = pos + Number(digits);
    if (end > data.length || end <= sp + 1 || data[end - 1] !== 0x0a) throw bad("a PAX record of a wrong length");
    const rec = latin.decode(data.subarray(sp + 1, end - 1));
    const eq = rec.indexOf("=");
    if (eq <= 0) throw bad("a PAX record without a key");
    out.set(rec.slice(0, eq), rec.slice(eq + 1));
    pos = end;
  }
  return out;
}

/** Reads exact counts of bytes from a byte stream. */
class Source {
  private buf: Uint8Array = new Uint8Array(0);
  private at = 0;
  constructor(private readonly r: ReadableStreamDefaultReader<Uint8Array>) {}

  /** Up to n bytes, fewer only at the stream's end (empty there). */
  async some(n: number): Promise<Uint8Array> {
    if (this.at >= this.buf.length) {
      const { value, done } = await this.r.read();
      if (done || !value) return new Uint8Array(0);
      this.buf = value;
      this.at = 0;
    }
    const out = this.buf.subarray(this.at, Math.min(this.buf.length, this.at + n));
    this.at += out.length;
    return out;
  }

  /** Exactly n bytes; null when the stream ends before the first one. */
  async exact(n: number, what: string): Promise<Uint8Array | null> {
    const first = await this.some(n);
    if (first.length === 0) return null;
    if (first.length === n) return first.slice();
    const out = new Uint8Array(n);
    out.set(first);
    let got = first.length;
    while (got < n) {
      const b = await this.some(n - got);
      if (b.length === 0) throw bad(`the tar stream ended inside ${what}`);
      out.set(b, got);
      got += b.length;
    }
    return out;
  }
}

/** Reads the entries of a tar stream, at most maxEntries of them and
 * maxBytes of their data and extension headers in all, written or skipped.
 * The sizes the stream declares serve only to refuse early; every byte is
 * counted as it is read. */
export class TarReader {
  bytes = 0;
  entries = 0;
  private left = 0;
  private pad = 0;
  private readonly src: Source;

  constructor(stream: ReadableStream<Uint8Array>, readonly maxBytes: number, readonly maxEntries: number) {
    this.src = new Source(stream.getReader());
  }

  private charge(n: number): void {
    if (this.bytes + n > this.maxBytes) {
      throw new LimitError(`the directory holds more than maxBytes (${this.maxBytes} bytes)`, { code: "extract_limit" });
    }
    this.bytes += n;
  }

  /** Up to CHUNK bytes of the current entry's data; empty at its end. */
  async read(): Promise<Uint8Array> {
    if (this.left <= 0) return new Uint8Array(0);
    const b = await this.src.some(Math.min(CHUNK, this.left));
    if (b.length === 0) throw bad("the tar stream ended inside an entry");
    this.charge(b.length);
    this.left -= b.length;
    return b;
  }

  private async skip(): Promise<void> {
    while ((await this.read()).length > 0);
    if (this.pad) {
      if ((await this.src.exact(this.pad, "an entry's padding")) === null) throw bad("the tar stream ended inside an entry");
      this.pad = 0;
    }
  }

  private data(size: number): void {
    if (size > this.maxBytes - this.bytes) this.charge(size); // throws: it cannot fit
    this.left = size;
    this.pad = (BLOCK - (size % BLOCK)) % BLOCK;
  }

  /** The whole data of an extension header. */
  private async meta(size: number): Promise<Uint8Array> {
    if (size > MAX_META) throw bad(`a tar extension header of ${size} bytes, more than ${MAX_META}`);
    this.data(size);
    const parts: Uint8Array[] = [];
    for (let b = await this.read(); b.length > 0; b = await this.read()) parts.push(b.slice());
    await this.skip();
    const out = new Uint8Array(size);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  /** The next entry, with its data to read; null at the end of the archive.
   * A stream that ends without the end-of-archive block is invalid: a
   * transfer cut between two entries must not look whole. */
  async next(): Promise<Entry | null> {
    await this.skip();
    let records = new Map<string, string>();
    let longName: string | undefined;
    for (let i = 0; i <= MAX_META_RUN; i++) {
      const h = await this.src.exact(BLOCK, "a header");
      if (h === null) throw bad("the tar stream ended before its end-of-archive block");
      if (h.every((b) => b === 0)) return null;
      const want = num(h.subarray(148, 156), "checksum");
      let unsigned = 8 * 32, signed = 8 * 32;
      for (let j = 0; j < BLOCK; j++) {
        if (j >= 148 && j < 156) continue;
        unsigned += h[j]!;
        // Some old writers summed the bytes as signed chars.
        signed += h[j]! & 0x80 ? h[j]! - 256 : h[j]!;
      }
      if (want !== unsigned && want !== signed) throw bad("a tar header with a wrong checksum");
      const flag = h[156]!;
      let size = num(h.subarray(124, 136), "size");
      const f = String.fromCharCode(flag);
      if (f === "x" || f === "g") {
        const r = pax(await this.meta(size));
        if (f === "x") records = new Map([...records, ...r]);
        continue;
      }
      if (f === "L" || f === "K") {
        const d = await this.meta(size);
        if (f === "L") longName = str(d);
        continue;
      }
      this.entries++;
      if (this.entries > this.maxEntries) {
        throw new LimitError(`the directory holds more than maxEntries (${this.maxEntries} entries)`, { code: "extract_limit" });
      }
      let name = str(h.subarray(0, 100));
      if (str(h.subarray(257, 263)) === "ustar" && h[263 - 1] === 0 && h[345] !== 0) name = str(h.subarray(345, 500)) + "/" + name;
      if (longName !== undefined) name = longName;
      if (records.get("path")) name = records.get("path")!;
      const ps = records.get("size");
      if (ps !== undefined) {
        if (!/^[0-9]{1,15}$/.test(ps)) throw bad("a PAX size that is not a number");
        size = Number(ps);
      }
      const sparse = f === "S" || [...records.keys()].some((k) => k.startsWith("GNU.sparse."));
      let kind: Entry["kind"] = "other";
      if (f === "5" || (flag === 0 && name.endsWith("/"))) kind = "dir";
      else if (f === "0" || flag === 0) kind = "file";
      this.data(size);
      return { name, kind, mode: num(h.subarray(100, 108), "mode"), size, sparse };
    }
    throw bad(`more than ${MAX_META_RUN} extension headers before one entry`);
  }
}

/** The components of a tar entry's name below the destination; [] for the
 * destination itself. A name that leaves it, is longer than MAX_NAME bytes
 * or deeper than MAX_DEPTH directories is refused. */
export function localParts(name: string): string[] {
  if (name.includes("\0") || name.startsWith("/")) {
    throw new ExtractError(`tar entry ${JSON.stringify(name)} lands outside the destination`, { code: "invalid_path" });
  }
  const parts: string[] = [];
  for (const p of name.split("/")) {
    if (p === "" || p === ".") continue;
    if (p === "..") {
      if (parts.length === 0) throw new ExtractError(`tar entry ${JSON.stringify(name)} lands outside the destination`, { code: "invalid_path" });
      parts.pop();
    } else {
      parts.push(p);
    }
  }
  if (new TextEncoder().encode(name).length > MAX_NAME || parts.length - 1 > MAX_DEPTH) {
    throw new ExtractError(`tar entry ${JSON.stringify(name.slice(0, 64))}... is longer than ${MAX_NAME} bytes or deeper than ${MAX_DEPTH} directories`, { code: "invalid_path" });
  }
  return parts;
}

const enc = new TextEncoder();

function octal(h: Uint8Array, at: number, width: number, n: number): void {
  const s = n.toString(8).padStart(width - 1, "0");
  h.set(enc.encode(s), at);
}

/** The PAX record "<length> key=value\n". */
function record(key: string, value: string): Uint8Array {
  const body = enc.encode(` ${key}=${value}\n`);
  let len = body.length + 1;
  while (String(len).length + body.length !== len) len = String(len).length + body.length;
  return enc.encode(`${len} ${key}=${value}\n`);
}

function header(name: Uint8Array, type: string, mode: number, size: number, link = new Uint8Array()): Uint8Array {
  const h = new Uint8Array(BLOCK);
  h.set(name.subarray(0, 100), 0);
  octal(h, 100, 8, mode & 0o7777);
  octal(h, 108, 8, 0); // uid: the tar names no owner
  octal(h, 116, 8, 0); // gid
  octal(h, 124, 12, size);
  octal(h, 136, 12, 0); // mtime
  h[156] = type.charCodeAt(0);
  h.set(link.subarray(0, 100), 157);
  h.set(enc.encode("ustar\x0000"), 257);
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  h.set(enc.encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
  return h;
}

/** The header blocks of one entry: a PAX header first when its name or
 * link is too long for ustar's fields or not ASCII. uid and gid are 0 and
 * there are no user or group names: who owns the files locally is none of
 * the sandbox's business. */
export function entryHeader(name: string, type: "0" | "2" | "5", mode: number, size: number, link = ""): Uint8Array {
  const n = enc.encode(name), l = enc.encode(link);
  // eslint-disable-next-line no-control-regex
  const ascii = (s: string) => /^[\x20-\x7e]*$/.test(s);
  const blocks: Uint8Array[] = [];
  if (n.length > 100 || l.length > 100 || !ascii(name) || !ascii(link)) {
    const recs = [record("path", name)];
    if (link) recs.push(record("linkpath", link));
    const data = new Uint8Array(recs.reduce((s, r) => s + r.length, 0));
    let at = 0;
    for (const r of recs) {
      data.set(r, at);
      at += r.length;
    }
    blocks.push(header(enc.encode("PaxHeader"), "x", 0o644, data.length), padded(data));
  }
  blocks.push(header(n, type, mode, size, l));
  const out = new Uint8Array(blocks.reduce((s, b) => s + b.length, 0));
  let at = 0;
  for (const b of blocks) {
    out.set(b, at);
    at += b.length;
  }
  return out;
}

/** data padded with zeros to a whole number of blocks. */
export function padded(data: Uint8Array): Uint8Array {
  const out = new Uint8Array(Math.ceil(data.length / BLOCK) * BLOCK);
  out.set(data);
  return out;
}
