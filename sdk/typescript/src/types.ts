// The API's wire types, field for field as the JSON carries them
// (docs/api.md; the Go package api is their reference).

/** A sandbox's observed state (docs/states.md). */
export type State =
  | "pending" | "starting" | "running" | "stopping" | "stopped" | "exited" | "expired"
  | "deleted" | "lost" | "attention" | "quarantined" | "failed";

/** What the API was last asked for. */
export type Mode = "running" | "stopped" | "deleted";

/** CPU and memory, as Kubernetes quantities. */
export interface Resources {
  cpu_request?: string;
  cpu_limit?: string;
  memory_request?: string;
  memory_limit?: string;
}

/** A volume of a sandbox. */
export interface Volume {
  /** A DNS label, not starting with hiloop-. */
  name: string;
  /** A Kubernetes quantity, 1Mi to 64Ti. */
  size: string;
  /** A clean absolute path other than /. */
  mount_path: string;
  /** One the deployment backs; the cluster default when absent. */
  storage_class?: string;
}

/** A sandbox as the API shows it. */
export interface SandboxInfo {
  id: string;
  state: State;
  /** The contradiction behind attention or quarantined. */
  anomaly?: string;
  /** More about the state, when there is more to say. */
  reason?: string;
  /** The workload's exit code once it exited. */
  exit_code?: number;
  desired: Mode;
  image: string;
  resources: Resources;
  ttl?: string;
  shutdown_policy: string;
  expires_at?: string;
  volumes: Volume[];
  labels: Record<string, string>;
  transports: string[];
  /** What the receipt promised: gvisor, or insecure-no-gvisor. */
  isolation?: string;
  /** What attestation saw: gvisor, not-gvisor or unknown. */
  runtime_observed?: string;
  kernel_release?: string;
  /** The workload's environment beside the image's, as created. */
  env?: Record<string, string>;
  /** "0s" when idle stop is off. */
  idle_timeout: string;
  last_activity_at: string;
  /** user, idle, ttl or outside, while stopping, stopped or expired. */
  stopped_by?: string;
  created_at: string;
  updated_at: string;
}

/** A page of sandboxes; next is the cursor of the following page. */
export interface SandboxList {
  items: SandboxInfo[];
  next?: string;
}

/** One change of a sandbox's state. */
export interface Event {
  seq: number;
  at: string;
  from: State;
  to: State;
  reason?: string;
}

/** The caller's organization, its quotas and its live sessions. */
export interface Org {
  id: string;
  name: string;
  max_sandboxes: number;
  max_running: number;
  idle_timeout?: string;
  created_at: string;
  sessions?: { open: number; max_per_org: number; busiest_sandbox: number; max_per_sandbox: number };
}

/** The body of POST /v1/sandboxes. */
export interface CreateSandboxRequest {
  image: string;
  resources?: Resources;
  ttl?: string;
  shutdown_policy?: string;
  volumes?: Volume[];
  transports?: string[];
  labels?: Record<string, string>;
  idle_timeout?: string;
  env?: Record<string, string>;
}

/** The body of PATCH /v1/sandboxes/{id}. */
export interface UpdateSandboxRequest {
  ttl?: string;
  idle_timeout?: string;
}

/** The answer of POST .../exec/run. */
export interface ExecRunResponse {
  exit_code?: number;
  signal?: string;
  timed_out: boolean;
  stdout: string;
  stderr: string;
  /** How stdout and stderr are written: utf-8 text, or base64 when either
   * is not valid UTF-8 (absent from servers before the field). */
  encoding?: "utf-8" | "base64";
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  duration_ms: number;
}

/** What an upload wrote: the bytes the server received. */
export interface FileInfo {
  path: string;
  size: number;
  sha256: string;
}

/** The exec stream's last message. */
export interface ExitFrame {
  exit_code?: number;
  signal?: string;
  error?: { code: string; message: string; field?: string; request_id?: string };
}

/** What lstat says of one file (a symbolic link is itself). */
export interface FileEntry {
  /** The name in its directory (/ for the root); bytes that are not valid
   * UTF-8 come as U+FFFD. */
  name: string;
  /** The absolute path: in stat's, mkdir's and rename's answers, not in a
   * listing's entries. */
  path?: string;
  /** file, dir, symlink or other (a device, FIFO or socket). */
  type: "file" | "dir" | "symlink" | "other";
  /** st_size: a file's bytes, a link's target's length. */
  size: number;
  /** The permission bits with setuid, setgid and sticky (st_mode & 0o7777):
   * 420 is 0o644. */
  mode: number;
  /** The last modification, to the second, in UTC (RFC 3339). */
  mtime: string;
}

/** A directory's entries, sorted by name in byte order. */
export interface FileList {
  path: string;
  entries: FileEntry[];
  /** The directory holds more than the 10,000 entries answered. */
  truncated: boolean;
}

/** A background process as the API shows it. */
export interface ProcessInfo {
  id: string;
  sandbox_id: string;
  command: string[];
  /** running, exited (with exit_code) or ended (gone without an exit
   * status; reason says why). */
  state: "running" | "exited" | "ended";
  /** Its exit status once it exited, 128 plus the signal's number for a
   * death by signal. */
  exit_code?: number;
  /** Why it ended: sandbox_stopped, pod_replaced, state_lost or
   * start_failed. */
  reason?: string;
  started_at: string;
  ended_at?: string;
  /** The bytes of output it has written in all, when the sandbox was asked. */
  output_bytes?: number;
}

/** A preview: a TCP port of a sandbox served at a URL of its own. */
export interface Preview {
  /** pv_... */
  id: string;
  sandbox_id: string;
  port: number;
  /** token (the URL carries a token of its own) or key (a visitor sends an
   * API key of the organization). */
  auth: "token" | "key";
  /** Where the port is served. A token preview's create answers it with
   * its token (?hiloop_preview_token=...); list does not. */
  url: string;
  /** A token preview's token, in its create's answer only: a client sends
   * it as Authorization: Bearer. */
  token?: string;
  created_at: string;
  expires_at: string;
}
