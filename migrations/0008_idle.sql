-- Idle stop: a running sandbox that nobody used through hiloop for its idle
-- timeout is stopped, and its owner's next ssh, -L or exec with wake=true
-- starts it again.
--
-- idle_timeout is in seconds; 0 turns idle stop off (every sandbox made
-- before this migration).
ALTER TABLE sandboxes ADD COLUMN idle_timeout INTEGER NOT NULL DEFAULT 0 CHECK (idle_timeout >= 0);

-- last_activity_at (ms) is when the idle clock last started: the end of
-- the last exec, ssh session or -L channel, a touch, or the moment the
-- sandbox came up running, whichever is latest. It is written coarsely,
-- not per packet.
ALTER TABLE sandboxes ADD COLUMN last_activity_at INTEGER NOT NULL DEFAULT 0;
UPDATE sandboxes SET last_activity_at = updated_at;

-- activity_open is 1 while the process that wrote it held a session or
-- channel open into the sandbox. A start of hiloop finds the ones the last
-- process left open and takes their activity to have lasted until then.
ALTER TABLE sandboxes ADD COLUMN activity_open INTEGER NOT NULL DEFAULT 0;

-- stop_cause says who asked a sandbox to stop: 'user' (the API) or 'idle'.
-- Only an idle stop may be woken. '' before this migration, read as 'user'.
ALTER TABLE sandboxes ADD COLUMN stop_cause TEXT NOT NULL DEFAULT '' CHECK (stop_cause IN ('', 'user', 'idle'));

-- An organization's idle timeout for sandboxes created without one, in
-- seconds; NULL takes the deployment's (--default-idle-timeout), 0 is off.
ALTER TABLE orgs ADD COLUMN idle_timeout INTEGER CHECK (idle_timeout >= 0);

-- The idle check runs every few seconds and reads only the running
-- sandboxes with an idle timeout, in order of the moment they go idle.
CREATE INDEX sandboxes_idle ON sandboxes (last_activity_at + idle_timeout * 1000)
	WHERE idle_timeout > 0 AND state = 'running';
