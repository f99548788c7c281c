// hiloop's TypeScript SDK: `import { Client } from "hiloop"`.

export { Client, Sandboxes, Sandbox, WAKE_WAIT, argv, isLoopback } from "./client.js";
export type { ClientOptions, Call, Answer, Command, CreateOptions, ListOptions, WaitOptions, RunOptions } from "./client.js";
export { CommandResult, ExecSession, EXEC_SUBPROTOCOL, MAX_OUTPUT, CHAN_STDIN, CHAN_STDOUT, CHAN_STDERR, CHAN_EXIT, CHAN_RESIZE, CHAN_CLOSE_IN } from "./exec.js";
export type { ExecOptions, Stdin } from "./exec.js";
export { Files, TAR_MEDIA_TYPE, MAX_FILE_BYTES, MAX_ENTRIES, FS_TIMEOUT } from "./files.js";
export { Processes, Process, ProcessOutput, OUTPUT_OFFSET_HEADER, MAX_PROCESS_STDIN } from "./processes.js";
export type { ProcessSignal } from "./processes.js";
export { Previews } from "./previews.js";
export type { PreviewOptions } from "./previews.js";
export type { Download, DownloadOptions } from "./files.js";
export {
  HiloopError, InvalidRequestError, AuthenticationError, NotFoundError, ConflictError, QuotaError, UnsupportedError,
  UnavailableError, StreamLostError, ExtractError, LimitError, WaitError, errorFor,
} from "./errors.js";
export type { ErrorDetails } from "./errors.js";
export type * from "./types.js";
