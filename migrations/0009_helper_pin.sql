-- helper_pin_pod and helper_pin_key are the host key (its SHA256
-- fingerprint) that the session helper of pod helper_pin_pod showed the
-- gateway first: the pin that pod's helper is held to for the rest of its
-- life, across restarts of hiloop. A new pod's first key replaces it.
ALTER TABLE sandboxes ADD COLUMN helper_pin_pod TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN helper_pin_key TEXT NOT NULL DEFAULT '';
