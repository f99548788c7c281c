package control

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hiloop/hiloop/api"
)

// TestListScriptTrailingNewlines: names that end in newlines, last in
// their chunk, list as themselves: the records' trailing newlines survive
// the command substitution that strips stat's NULs.
func TestListScriptTrailingNewlines(t *testing.T) {
	dir := t.TempDir()
	names := []string{"a\n", "z\n\n"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command("sh", "-c", listScript, "sh", dir, fmt.Sprint(api.MaxListEntries), fmt.Sprint(maxListOutput))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	l := parseListing(out.Bytes(), api.MaxListEntries)
	if len(l.Entries) != len(names) || l.Truncated {
		t.Fatalf("%+v, want %q", l, names)
	}
	for i, e := range l.Entries {
		if e.Name != names[i] || e.Type != TypeFile {
			t.Errorf("entry %d: %+v, want %q", i, e, names[i])
		}
	}
}
