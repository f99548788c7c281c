-- runtime_pod is the uid of the last pod whose runtime hiloop observed from
-- inside it (runtime attestation), runtime_observed what it saw there
-- (gvisor, not-gvisor, unknown) and runtime_release the kernel release
-- it read, capped. The receipt is the promise; these are the observation.
-- The mirror holds a pod seen outside gVisor to be quarantined
-- (runtime_not_gvisor) for as long as that pod lives.
ALTER TABLE sandboxes ADD COLUMN runtime_pod TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN runtime_observed TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN runtime_release TEXT NOT NULL DEFAULT '';
