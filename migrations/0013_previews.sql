-- Preview URLs: a sandbox's port served on the preview domain. A preview
-- made with auth 'token' holds only a SHA-256 hash of its token; one made
-- with auth 'key' has none and takes an API key of its organization. A
-- preview works until expires_at, until it is revoked (its row deleted), and
-- while the API key that made it (key_id) is live.
CREATE TABLE previews (
	id         TEXT PRIMARY KEY,
	org_id     TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	key_id     TEXT NOT NULL,
	port       INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
	auth       TEXT NOT NULL CHECK (auth IN ('token', 'key')),
	token_hash BLOB UNIQUE,
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	CHECK ((auth = 'token') = (token_hash IS NOT NULL))
);
CREATE INDEX previews_sandbox ON previews (sandbox_id, expires_at);
