// sb.previews: a sandbox's ports served at preview URLs
// (POST /v1/sandboxes/{id}/previews), for a browser or any HTTP client.

import type { Sandbox } from "./client.js";
import type { Preview } from "./types.js";

/** How create serves a port. */
export interface PreviewOptions {
  /** Who may visit: token (the default), anyone holding the URL's token;
   * key, a caller with an API key of the sandbox's organization. */
  auth?: "token" | "key";
  /** How long it works, a Go duration from 1s to 720h (24h). */
  ttl?: string;
  signal?: AbortSignal;
}

/** sb.previews: create, list and revoke the sandbox's previews. The
 * deployment needs serve --preview-domain (else NotFoundError
 * previews_disabled) and the sandbox the forward transport. */
export class Previews {
  constructor(private readonly sb: Sandbox) {}

  /** Serves port (on the sandbox's loopback) at a new preview URL. A token
   * preview's url and token are in this answer only. It is sent once,
   * never retried: a second try would make a second preview. */
  create(port: number, opts: PreviewOptions = {}): Promise<Preview> {
    const req: Record<string, unknown> = { port };
    if (opts.auth !== undefined) req["auth"] = opts.auth;
    if (opts.ttl !== undefined) req["ttl"] = opts.ttl;
    return this.sb.client.json<Preview>({ method: "POST", path: this.sb.path("/previews"), payload: req, once: true, signal: opts.signal });
  }

  /** The live previews, oldest first, their URLs without tokens. */
  async list(opts: { signal?: AbortSignal } = {}): Promise<Preview[]> {
    return (await this.sb.client.json<{ items: Preview[] }>({ method: "GET", path: this.sb.path("/previews"), signal: opts.signal })).items;
  }

  /** Revokes the preview id: its URL stops working at once, and the
   * connections open through it end. */
  async revoke(id: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.sb.client.json<void>({ method: "DELETE", path: this.sb.path("/previews/" + encodeURIComponent(id)), signal: opts.signal });
  }
}
