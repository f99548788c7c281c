// The API's refusals as errors: one class per family, each carrying the
// stable code, the message and the request id (which finds the request in
// the server's log), as the Python SDK's hiloop.errors does.

/** What every HiloopError carries besides its message. */
export interface ErrorDetails {
  /** The API's stable code (docs/api.md, Errors), or one of the client's own. */
  code?: string;
  /** The HTTP status, 0 for the client's own refusals. */
  status?: number;
  /** The request's id in the server's log. */
  requestId?: string;
  /** For invalid_field, the field at fault. */
  field?: string;
  /** Seconds the server asked to wait before a retry (429, 503). */
  retryAfter?: number;
  /** The error this one stands for, if any. */
  cause?: unknown;
}

/** An error the API answered, or one of the client's own. */
export class HiloopError extends Error {
  readonly code: string;
  readonly status: number;
  readonly requestId: string;
  readonly field: string;
  readonly retryAfter: number | undefined;

  constructor(message: string, d: ErrorDetails = {}) {
    super(message, d.cause === undefined ? undefined : { cause: d.cause });
    this.name = new.target.name;
    this.code = d.code ?? "";
    this.status = d.status ?? 0;
    this.requestId = d.requestId ?? "";
    this.field = d.field ?? "";
    this.retryAfter = d.retryAfter;
  }

  override toString(): string {
    let s = this.code ? `${this.name}: ${this.message} (${this.code})` : `${this.name}: ${this.message}`;
    if (this.requestId) s += ` [request ${this.requestId}]`;
    return s;
  }
}

/** 400, 411, 413, 415: the request itself is wrong (field says which part). */
export class InvalidRequestError extends HiloopError {}

/** 401: missing, unknown or revoked key. */
export class AuthenticationError extends HiloopError {}

/** 404: no such sandbox in your organization, no such file, no such route. */
export class NotFoundError extends HiloopError {}

/** 409: the sandbox's state forbids it (not running, quarantined, ...). */
export class ConflictError extends HiloopError {}

/** 429: a quota, a session limit or a rate limit. */
export class QuotaError extends HiloopError {}

/** 422: a capability the deployment or the sandbox's image lacks
 * (unsupported_capability, tar_unavailable, shell_unavailable, ...). */
export class UnsupportedError extends HiloopError {}

/** 502, 503, 504: hiloop or the cluster cannot do it now; try again. */
export class UnavailableError extends HiloopError {}

/** The exec stream broke before the exit status arrived (code stream_lost):
 * the command's fate is unknown. Never a non-zero exit code. */
export class StreamLostError extends HiloopError {}

/** A directory's tar stream that downloadDir refused to write, since what
 * the sandbox sends is not trusted. code says why: invalid_path (an entry
 * names a place outside the destination), path_conflict (a directory on an
 * entry's way is a symbolic link or a file, or the entry's place holds what
 * it cannot replace), sparse_entry (a sparse file), invalid_tar (not a
 * well-formed tar stream, or one that ended early). */
export class ExtractError extends HiloopError {}

/** The server sent more than the client accepts: code extract_limit
 * (downloadDir past maxBytes or maxEntries), output_limit (exec's collected
 * output past maxOutput, read past maxBytes, a JSON answer past 32 MiB). */
export class LimitError extends HiloopError {}

/** Waiting for a state ended in another state that will not lead to it
 * (code wait_failed), or the wait's own timeout passed (wait_timeout). */
export class WaitError extends HiloopError {}

/** The error of an error answer: its class is the status's family. */
export function errorFor(status: number, message: string, d: ErrorDetails = {}): HiloopError {
  const details = { ...d, status };
  if (status === 401) return new AuthenticationError(message, details);
  if (status === 404) return new NotFoundError(message, details);
  if (status === 409) return new ConflictError(message, details);
  if (status === 429) return new QuotaError(message, details);
  if (status === 422) return new UnsupportedError(message, details);
  if (status === 502 || status === 503 || status === 504) return new UnavailableError(message, details);
  if (status >= 400 && status < 500) return new InvalidRequestError(message, details);
  return new HiloopError(message, details);
}
