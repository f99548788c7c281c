-- helper_key_changed_pod is the uid of a pod whose session helper showed the
-- gateway another host key within its life: the mirror holds that pod to be
-- an attention anomaly (helper_host_key_changed). A new pod clears it.
ALTER TABLE sandboxes ADD COLUMN helper_key_changed_pod TEXT NOT NULL DEFAULT '';
