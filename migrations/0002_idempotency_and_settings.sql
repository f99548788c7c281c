-- Retried creates carry an Idempotency-Key; the first request's hash is kept so
-- that a retry with a different body is refused instead of silently answered.
ALTER TABLE sandboxes ADD COLUMN idempotency_key TEXT;
ALTER TABLE sandboxes ADD COLUMN request_hash TEXT;
CREATE UNIQUE INDEX sandboxes_idempotency ON sandboxes (org_id, idempotency_key)
	WHERE idempotency_key IS NOT NULL;

-- Facts the deployment records about itself, such as whether the first-start
-- admin key was already issued.
CREATE TABLE settings (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
