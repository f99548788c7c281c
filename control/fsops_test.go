package control

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/api"
)

// chunk is listScript's output for names, with stat's records recs.
func chunk(names []string, recs string) string {
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n + "\x00")
	}
	b.WriteString("\x00" + recs + "\x00")
	return b.String()
}

// TestParseListing: the parser takes what stat said of the names the
// shell found, and nothing a hostile stat adds: records of other names,
// duplicates, negative or absurd numbers, names that cannot be names.
// Output that breaks the framing ends the listing, Truncated.
func TestParseListing(t *testing.T) {
	t0 := time.Unix(1700000000, 0).UTC()
	file := func(name string, size int64, mode uint32) FileStat {
		return FileStat{Name: name, Type: TypeFile, Size: size, Mode: mode, MTime: t0}
	}
	for _, tc := range []struct {
		name string
		out  string
		want Listing
	}{
		{"empty directory", "", Listing{}},
		{"kinds and bits", chunk([]string{"d", "f", "l", "p"}, "41ed 4096 1700000000 d\n89ed 3 1700000000 f\na1ff 7 1700000000 l\n11a4 0 1700000000 p\n"),
			Listing{Entries: []FileStat{{Name: "d", Type: TypeDir, Size: 4096, Mode: 0o755, MTime: t0}, {Name: "f", Type: TypeFile, Size: 3, Mode: 0o4755, MTime: t0},
				{Name: "l", Type: TypeSymlink, Size: 7, Mode: 0o777, MTime: t0}, {Name: "p", Type: TypeOther, Mode: 0o644, MTime: t0}}}},
		{"a newline in a name", chunk([]string{"a\n81a4 9 1 b", "b"}, "81a4 1 1700000000 a\n81a4 9 1 b\n81a4 2 1700000000 b\n"),
			Listing{Entries: []FileStat{file("a\n81a4 9 1 b", 1, 0o644), file("b", 2, 0o644)}}},
		{"a file gone before stat", chunk([]string{"a", "gone", "c"}, "81a4 1 1700000000 a\n81a4 3 1700000000 c\n"),
			Listing{Entries: []FileStat{file("a", 1, 0o644), file("c", 3, 0o644)}}},
		{"sorted by bytes", chunk([]string{"b", "B", "ü", "-rf"}, "81a4 0 1700000000 b\n81a4 0 1700000000 B\n81a4 0 1700000000 ü\n81a4 0 1700000000 -rf\n"),
			Listing{Entries: []FileStat{file("-rf", 0, 0o644), file("B", 0, 0o644), file("b", 0, 0o644), file("ü", 0, 0o644)}}},
		{"two chunks and the cap's mark", chunk([]string{"a"}, "81a4 0 1700000000 a\n") + chunk([]string{"b"}, "81a4 0 1700000000 b\n") + "/truncated\x00",
			Listing{Entries: []FileStat{file("a", 0, 0o644), file("b", 0, 0o644)}, Truncated: true}},
		{"a stat that lies about others", chunk([]string{"a"}, "81a4 0 1700000000 a\n81a4 0 1700000000 planted\n"),
			Listing{Entries: []FileStat{file("a", 0, 0o644)}}},
		{"a record of another name", chunk([]string{"a"}, "81a4 0 1700000000 b\n"), Listing{}},
		{"bad numbers", chunk([]string{"a", "b", "c", "d", "e"}, "81a4 -1 1 a\n81a4 +1 1 b\nzz 1 1 c\n81a4 99999999999999999999 1 d\n181a4 1 1 e\n"), Listing{}},
		{"absurd times are clamped", chunk([]string{"a", "b"}, "81a4 0 -99999999999999 a\n81a4 0 9223372036854775807 b\n"),
			Listing{Entries: []FileStat{{Name: "a", Type: TypeFile, Mode: 0o644, MTime: minMTime}, {Name: "b", Type: TypeFile, Mode: 0o644, MTime: maxMTime}}}},
		{"names that are not names", chunk([]string{".", "..", "a"}, "41ed 0 1700000000 .\n41ed 0 1700000000 ..\n81a4 0 1700000000 a\n"),
			Listing{Entries: []FileStat{file("a", 0, 0o644)}}},
		{"a name twice", chunk([]string{"a", "a"}, "81a4 1 1700000000 a\n81a4 2 1700000000 a\n"), Listing{Entries: []FileStat{file("a", 1, 0o644)}}},
		{"cut in the names", "a\x00b", Listing{Truncated: true}},
		{"cut in the records", "a\x00\x0081a4 0 1700000000 a\n", Listing{Truncated: true}},
		{"an empty chunk", "\x00\x00", Listing{Truncated: true}},
		{"a name past any file system's", chunk([]string{strings.Repeat("n", maxName+1)}, ""), Listing{Truncated: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, parseListing([]byte(tc.out), 100)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseListingCap: past max entries the listing is Truncated.
func TestParseListingCap(t *testing.T) {
	var names []string
	var recs strings.Builder
	for i := range 10 {
		n := fmt.Sprintf("f%d", i)
		names = append(names, n)
		recs.WriteString("81a4 0 0 " + n + "\n")
	}
	l := parseListing([]byte(chunk(names, recs.String())), 4)
	if len(l.Entries) != 4 || !l.Truncated {
		t.Errorf("%d entries, truncated %v; want 4, true", len(l.Entries), l.Truncated)
	}
}

// TestListScriptOnThisMachine runs listScript with this machine's sh and
// stat (GNU's or busybox's) on names a hostile workload would choose, and
// in chunks: what it prints parses back to every name.
func TestListScriptOnThisMachine(t *testing.T) {
	dir := t.TempDir()
	names := []string{"a b", "-rf", "new\nline", `q'"`, ".hidden", "..dd", "ü", "*", "$(touch x)", "\\", " lead"}
	for i := range 300 {
		names = append(names, fmt.Sprintf("n%03d", i))
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("nowhere", filepath.Join(dir, "dangling"))
	os.Mkdir(filepath.Join(dir, "sub"), 0o750)
	names = append(names, "dangling", "sub")
	run := func(max int) Listing {
		var out, errOut bytes.Buffer
		cmd := exec.Command("sh", "-c", listScript, "sh", dir, fmt.Sprint(max), fmt.Sprint(maxListOutput))
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %s", err, errOut.String())
		}
		return parseListing(out.Bytes(), max)
	}
	l := run(api.MaxListEntries)
	if l.Truncated || len(l.Entries) != len(names) {
		t.Fatalf("%d entries (truncated %v), want %d", len(l.Entries), l.Truncated, len(names))
	}
	got := map[string]FileStat{}
	for _, e := range l.Entries {
		got[e.Name] = e
	}
	for _, n := range names {
		e, ok := got[n]
		switch {
		case !ok:
			t.Errorf("%q is missing", n)
		case n == "dangling" && (e.Type != TypeSymlink || e.Size != 7):
			t.Errorf("dangling: %+v", e)
		case n == "sub" && (e.Type != TypeDir || e.Mode != 0o750):
			t.Errorf("sub: %+v", e)
		case n != "dangling" && n != "sub" && (e.Type != TypeFile || e.Size != int64(len(n)) || e.Mode != 0o640 || time.Since(e.MTime) > time.Hour):
			t.Errorf("%q: %+v", n, e)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Error("a name ran as a command")
	}
	if l := run(20); !l.Truncated || len(l.Entries) != 20 {
		t.Errorf("past 20: %d entries, truncated %v", len(l.Entries), l.Truncated)
	}
}

// FuzzParseListing: whatever a sandbox prints, the parser neither panics
// nor answers more than max entries, or an entry that is not a name the
// output gave, with a size below 0 or a time RFC 3339 cannot write.
func FuzzParseListing(f *testing.F) {
	f.Add([]byte(chunk([]string{"a", "b\nc"}, "81a4 1 1700000000 a\n41ed 2 1 b\nc\n")), 3)
	f.Add([]byte(chunk([]string{"a"}, "81a4 1 1 a\n")+"/truncated\x00"), 1)
	f.Add([]byte("\x00\x00\x00"), 0)
	f.Fuzz(func(t *testing.T, out []byte, max int) {
		max = max & 0xff
		l := parseListing(out, max)
		if len(l.Entries) > max {
			t.Fatalf("%d entries past max %d", len(l.Entries), max)
		}
		for _, e := range l.Entries {
			if !validName(e.Name) || !bytes.Contains(out, []byte(e.Name+"\x00")) || e.Size < 0 || e.MTime.Before(minMTime) || e.MTime.After(maxMTime) || e.Mode > 0o7777 {
				t.Fatalf("entry %+v", e)
			}
			if _, err := e.MTime.MarshalJSON(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
