package receipt

import (
	"strings"
)

// Runtime is what hiloop saw of the kernel a sandbox's pod runs on: the
// observation that stands beside the receipt's promise.
type Runtime string

// What a runtime attestation can conclude.
const (
	// RuntimeGVisor: /proc/version is gVisor's.
	RuntimeGVisor Runtime = "gvisor"
	// RuntimeNotGVisor: /proc/version is a Linux kernel's line that is not
	// gVisor's, so the pod shares a real kernel (runc, or any runtime but
	// gVisor).
	RuntimeNotGVisor Runtime = "not-gvisor"
	// RuntimeUnknown: nothing readable came back (no probe could run, or
	// it printed something that is no kernel's line).
	RuntimeUnknown Runtime = "unknown"
)

// Known reports whether r is one of the observations above.
func (r Runtime) Known() bool {
	return r == RuntimeGVisor || r == RuntimeNotGVisor || r == RuntimeUnknown
}

// gvisorBuild is the build stamp that follows the release in every line of
// /proc/version gVisor serves, old (release 4.4.0) and new
// (4.19.0-gvisor); no real kernel is built with it.
const gvisorBuild = "#1 SMP Sun Jan 10 15:06:54 PST 2016"

// MaxKernelRelease bounds the kernel release kept from an observation: a
// real release is a few dozen characters, and the line comes from inside
// a sandbox, so whatever it holds is capped before it is stored.
const MaxKernelRelease = 64

// ClassifyKernel reads the first line of /proc/version as a probe printed
// it and says which runtime it shows, and the kernel release it names
// (at most MaxKernelRelease bytes; "" when unknown). A line counts only in
// the form every Linux kernel writes: "Linux version RELEASE ...", the
// release printable ASCII. gVisor's is RELEASE followed by gvisorBuild and
// nothing else.
func ClassifyKernel(out string) (Runtime, string) {
	line, _, _ := strings.Cut(out, "\n")
	line = strings.TrimRight(line, "\r \t")
	rest, ok := strings.CutPrefix(line, "Linux version ")
	if !ok {
		return RuntimeUnknown, ""
	}
	release, build, _ := strings.Cut(rest, " ")
	if release == "" || !printable(release) {
		return RuntimeUnknown, ""
	}
	if len(release) > MaxKernelRelease {
		release = release[:MaxKernelRelease]
	}
	if build == gvisorBuild {
		return RuntimeGVisor, release
	}
	return RuntimeNotGVisor, release
}

// printable reports whether s is printable ASCII without spaces.
func printable(s string) bool {
	for i := range len(s) {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
