-- Organizations own everything else: keys, SSH keys and sandboxes.
CREATE TABLE orgs (
	id            TEXT PRIMARY KEY,
	name          TEXT NOT NULL UNIQUE,
	max_sandboxes INTEGER NOT NULL CHECK (max_sandboxes >= 0),
	max_running   INTEGER NOT NULL CHECK (max_running >= 0),
	created_at    INTEGER NOT NULL
);

-- API keys: only a SHA-256 hash of the secret is kept.
CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	org_id     TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name       TEXT NOT NULL,
	hash       BLOB NOT NULL UNIQUE,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
CREATE INDEX api_keys_org ON api_keys (org_id);

-- SSH public keys, registered through the API, each owned by one org.
CREATE TABLE ssh_keys (
	id          TEXT PRIMARY KEY,
	org_id      TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name        TEXT NOT NULL,
	fingerprint TEXT NOT NULL UNIQUE,
	public_key  TEXT NOT NULL,
	created_at  INTEGER NOT NULL
);

-- Sandboxes: the requested spec and desired mode are intent; state, anomaly,
-- exit code and reason are only ever written from observation.
CREATE TABLE sandboxes (
	id           TEXT PRIMARY KEY,
	org_id       TEXT NOT NULL REFERENCES orgs (id),
	spec         TEXT NOT NULL,
	desired_mode TEXT NOT NULL CHECK (desired_mode IN ('running', 'stopped', 'deleted')),
	state        TEXT NOT NULL,
	anomaly      TEXT NOT NULL DEFAULT '',
	exit_code    INTEGER,
	reason       TEXT NOT NULL DEFAULT '',
	expires_at   INTEGER,
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL
);
CREATE INDEX sandboxes_org ON sandboxes (org_id, id);

-- Every observed state transition, in order.
CREATE TABLE sandbox_events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	at         INTEGER NOT NULL,
	from_state TEXT NOT NULL,
	to_state   TEXT NOT NULL,
	reason     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX sandbox_events_sandbox ON sandbox_events (sandbox_id, seq);
