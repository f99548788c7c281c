-- Background processes: commands started detached in a sandbox, which
-- outlive the call that started them. The sandbox keeps their output and
-- exit status (under /tmp/.hiloop/proc/<id>/); the record keeps what a
-- caller may ask of them when the sandbox cannot answer.
--
-- state is running, exited (exit_code set) or ended: the process is gone
-- without an exit status hiloop saw, for end_reason: its sandbox stopped
-- (sandbox_stopped), its pod was replaced (pod_replaced), its state in the
-- sandbox vanished (state_lost), or its start failed (start_failed).
-- pod_uid is the pod it was started in: it lives no longer than that pod.
CREATE TABLE processes (
	id         TEXT PRIMARY KEY,
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	command    TEXT NOT NULL,
	state      TEXT NOT NULL CHECK (state IN ('running', 'exited', 'ended')),
	exit_code  INTEGER,
	end_reason TEXT NOT NULL DEFAULT '' CHECK (end_reason IN ('', 'sandbox_stopped', 'pod_replaced', 'state_lost', 'start_failed')),
	pod_uid    TEXT NOT NULL,
	started_at INTEGER NOT NULL,
	ended_at   INTEGER
);

CREATE INDEX processes_sandbox ON processes (sandbox_id, started_at);
CREATE INDEX processes_running ON processes (sandbox_id) WHERE state = 'running';
