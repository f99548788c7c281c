package api_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStandsAlone: a program that imports api links no other package of
// hiloop's, the server and the record least of all.
func TestStandsAlone(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/hiloop/hiloop/api").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/hiloop/hiloop/") && dep != "github.com/hiloop/hiloop/api" {
			t.Errorf("api reaches %s", dep)
		}
	}
}
