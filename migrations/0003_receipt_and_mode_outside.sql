-- receipt is what the control plane promised for the sandbox when it was
-- created (runtime class, service account, storage, transports), as JSON. The
-- mirror holds the live pod to it, not to an annotation on that same pod.
-- Records made before this migration have '' and fall back to the annotation.
ALTER TABLE sandboxes ADD COLUMN receipt TEXT NOT NULL DEFAULT '';

-- mode_outside is 1 while the sandbox is observed stopped or stopping although
-- the API last asked it to run: someone changed its mode outside hiloop. It
-- does not count against max_running then.
ALTER TABLE sandboxes ADD COLUMN mode_outside INTEGER NOT NULL DEFAULT 0;

-- pod_uid is the live pod last observed, so a transition can say that the pod
-- was replaced or deleted.
ALTER TABLE sandboxes ADD COLUMN pod_uid TEXT NOT NULL DEFAULT '';
