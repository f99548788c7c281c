-- Each organization's live and running sandboxes, counted as the rows
-- change. The quota check runs on every create and start inside the write
-- transaction, and counted them from sandboxes_org_state: work that grew
-- with the organization, two index entries per sandbox it holds on every
-- create. Triggers now keep the counts in the same transaction as every
-- insert, update and delete of a sandbox, and the check reads one row.
--
-- live:    state not terminal (deleted, lost, failed);
-- running: live, not exited or expired, desired running, and not stopped
--          outside hiloop (mode_outside = 0).
-- These are the predicates of the counts they replace; TestOrgCounts holds
-- the triggers to them.
CREATE TABLE org_counts (
	org_id  TEXT PRIMARY KEY REFERENCES orgs (id),
	live    INTEGER NOT NULL DEFAULT 0,
	running INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

INSERT INTO org_counts (org_id, live, running)
SELECT org_id,
	sum(state NOT IN ('deleted', 'lost', 'failed')),
	sum(desired_mode = 'running' AND mode_outside = 0 AND state NOT IN ('deleted', 'lost', 'failed', 'exited', 'expired'))
FROM sandboxes GROUP BY org_id;

CREATE TRIGGER sandboxes_count_insert AFTER INSERT ON sandboxes BEGIN
	INSERT INTO org_counts (org_id, live, running) VALUES (NEW.org_id,
		NEW.state NOT IN ('deleted', 'lost', 'failed'),
		NEW.desired_mode = 'running' AND NEW.mode_outside = 0 AND NEW.state NOT IN ('deleted', 'lost', 'failed', 'exited', 'expired'))
	ON CONFLICT (org_id) DO UPDATE SET live = live + excluded.live, running = running + excluded.running;
END;

CREATE TRIGGER sandboxes_count_update AFTER UPDATE OF org_id, state, desired_mode, mode_outside ON sandboxes
WHEN OLD.org_id != NEW.org_id
	OR (OLD.state NOT IN ('deleted', 'lost', 'failed')) != (NEW.state NOT IN ('deleted', 'lost', 'failed'))
	OR (OLD.desired_mode = 'running' AND OLD.mode_outside = 0 AND OLD.state NOT IN ('deleted', 'lost', 'failed', 'exited', 'expired'))
		!= (NEW.desired_mode = 'running' AND NEW.mode_outside = 0 AND NEW.state NOT IN ('deleted', 'lost', 'failed', 'exited', 'expired'))
BEGIN
	UPDATE org_counts SET
		live = live - (OLD.state NOT IN ('deleted', 'lost', 'failed')),
		running = running - (OLD.desired_mode = 'running' AND OLD.mode_outside = 0 AND OLD.state NOT IN ('deleted', 'lost', 'failed', 'exited', 'expired'))
	WHERE org_id = OLD.org_id;
	INSERT INTO org_counts (org_id, live, running) VALUES (NEW.org_id,
		NEW.state NOT IN ('deleted', 'lost', 'failed'),
		NEW.desired_mode = 'running' AND NEW.mode_outside = 0 AND NEW.state NOT IN ('deleted', 'lost', 'failed', 'exited', 'expired'))
	ON CONFLICT (org_id) DO UPDATE SET live = live + excluded.live, running = running + excluded.running;
END;

CREATE TRIGGER sandboxes_count_delete AFTER DELETE ON sandboxes BEGIN
	UPDATE org_counts SET
		live = live - (OLD.state NOT IN ('deleted', 'lost', 'failed')),
		running = running - (OLD.desired_mode = 'running' AND OLD.mode_outside = 0 AND OLD.state NOT IN ('deleted', 'lost', 'failed', 'exited', 'expired'))
	WHERE org_id = OLD.org_id;
END;
