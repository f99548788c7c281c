package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// ExecProcs are the processes of exec commands in the shared cluster's
// pods whose command line matches re. kwok runs each command as a local
// process, a child of its kwok-controller, and a command's own children
// (a shell's) below it: only those count, so another cluster's commands
// on the same machine (another test process, another `make test`) never
// match, however alike their command lines.
func ExecProcs(t testing.TB, re *regexp.Regexp) []int {
	t.Helper()
	kwok, err := SharedCluster(t).PID("kwok-controller")
	if err != nil {
		t.Fatalf("kwok-controller's pid: %v", err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	cmdline := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // it exited
		}
		// pid (comm) state ppid ...: comm may hold spaces and parens.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 {
			continue
		}
		parent[pid], _ = strconv.Atoi(f[1])
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cmdline[pid] = strings.TrimSuffix(strings.ReplaceAll(string(raw), "\x00", " "), " ")
	}
	var out []int
	for pid, cl := range cmdline {
		if !re.MatchString(cl) {
			continue
		}
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == kwok {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// KillExecProcs ends the processes ExecProcs finds (SIGKILL): kwok does
// not signal a command whose stream closed, so a test reaps its own.
func KillExecProcs(t testing.TB, re *regexp.Regexp) {
	t.Helper()
	for _, pid := range ExecProcs(t, re) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
