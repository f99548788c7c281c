package layers

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/hiloop/hiloop"

// below names, for each package, the only hiloop packages its non-test code
// may reach, directly or not.
var below = map[string][]string{
	"api":               {},
	"cluster":           {},
	"sandbox":           {},
	"forward":           {},
	"metrics":           {"sandbox"},
	"store":             {"api", "sandbox", "migrations"},
	"k8s":               {"api", "cluster", "sandbox", "store", "migrations"},
	"internal/ociimage": {},
	"k8s/localcluster":  {"api", "cluster", "internal/ociimage", "k8s", "sandbox", "store", "migrations"},
	"control":           {"api", "cluster", "sandbox", "store", "metrics", "migrations"},
	"mirror":            {"api", "cluster", "control", "k8s", "sandbox", "store", "metrics", "migrations"},
	"server":            {"api", "cluster", "control", "sandbox", "store", "metrics", "migrations"},
	"sshd":              {"api", "cluster", "control", "forward", "sandbox", "store", "metrics", "migrations"},
	"agent":             {"forward"},
}

// TestCallsRunDownward: no package reaches a hiloop package above it or
// beside it, and the binary links no testing package.
func TestCallsRunDownward(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if deps := strings.Fields(string(out)); slices.Contains(deps, "testing") {
		t.Error("the hiloop binary links package testing")
	}
	for pkg, allowed := range below {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod+"/"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			rel, ok := strings.CutPrefix(dep, mod+"/")
			if !ok || rel == pkg {
				continue
			}
			if !slices.Contains(allowed, rel) {
				t.Errorf("%s reaches %s, which is not below it", pkg, rel)
			}
		}
	}
}
