-- env is the environment a sandbox was created with, a JSON object of
-- names to values, rendered into its workload container as plain values.
-- It has a column of its own, beside spec: the values may be the caller's
-- credentials, and this keeps them out of every rewrite of spec (a TTL
-- change) and of the label filters' reads. '{}' for every sandbox made
-- before this migration.
ALTER TABLE sandboxes ADD COLUMN env TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(env) AND json_type(env) = 'object');
