-- SSH keys are unique per organization, no longer across all of them.
--
-- With fingerprint UNIQUE over the whole table, an organization that
-- registered someone else's public key (public keys are public: code hosts
-- publish them) blocked its owner from registering it, and the 409 told it
-- that the key was registered somewhere. A key may now be registered by any
-- number of organizations, once in each; the gateway resolves a key and the
-- sandbox of the SSH user name together, so the registration that
-- authorizes a login is always the one of the organization that owns the
-- sandbox (store.SSHKeyForSandbox).
--
-- SQLite cannot drop a column's UNIQUE constraint, so the table is rebuilt.
-- Nothing references ssh_keys, so dropping the old table checks nothing.
CREATE TABLE ssh_keys_per_org (
	id          TEXT PRIMARY KEY,
	org_id      TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name        TEXT NOT NULL,
	fingerprint TEXT NOT NULL,
	public_key  TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	-- Serves the gateway's lookup (a sandbox's org, then the key's
	-- fingerprint) and an organization's list.
	UNIQUE (org_id, fingerprint)
);

INSERT INTO ssh_keys_per_org (id, org_id, name, fingerprint, public_key, created_at)
SELECT id, org_id, name, fingerprint, public_key, created_at FROM ssh_keys;

DROP TABLE ssh_keys;
ALTER TABLE ssh_keys_per_org RENAME TO ssh_keys;
