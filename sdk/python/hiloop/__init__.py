"""hiloop: run untrusted code in sandboxes from Python.

    import hiloop
    client = hiloop.Client()          # HILOOP_URL, HILOOP_TOKEN
    with client.sandboxes.create("hiloop.local/python:3.11", ttl="1h") as sb:
        sb.files.write("/work/main.py", "print(6*7)")
        print(sb.run(["python3", "/work/main.py"]).stdout)
"""

from .client import (Client, CommandResult, ExecSession, FileEntry, FileList, Files, Preview, Previews, Process,
                     ProcessOutput, Processes, Sandbox, SandboxInfo, Sandboxes)
from .errors import (AuthenticationError, ConflictError, ExtractError, HiloopError, InvalidRequestError, LimitError,
                     NotFoundError, QuotaError, StreamLostError, UnavailableError, UnsupportedError, WaitError)

__all__ = [
    "Client", "CommandResult", "ExecSession", "FileEntry", "FileList", "Files", "Preview", "Previews", "Process",
    "ProcessOutput", "Processes", "Sandbox", "SandboxInfo", "Sandboxes",
    "HiloopError", "AuthenticationError", "ConflictError", "ExtractError", "InvalidRequestError", "LimitError",
    "NotFoundError", "QuotaError", "StreamLostError", "UnavailableError", "UnsupportedError", "WaitError",
]
