package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/hiloop/hiloop/api"
)

// hostileNames are names a workload may give its files to reach the
// terminal of whoever lists them: C0 and C1 controls (ESC, CSI as
// U+009B, OSC as U+009D, NEL), DEL, and format characters that reorder or
// hide text (a right-to-left override, a zero-width space).
var hostileNames = []string{
	"a\x1b]0;owned\x07b",
	"csi\u009b31mred",
	"osc\u009d0;t\u009c",
	"nel\u0085x",
	"del\x7f",
	"evil\u202etxt.sh",
	"zero\u200bwidth",
	"line\u2028sep",
}

// rawControl reports a rune a terminal may act on rather than show.
func rawControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool {
		return r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029')
	}) >= 0
}

// TestListPrintsHostileNamesSafely: sandbox fs ls, as a table and as
// JSON, prints a name a workload chose without a byte a terminal acts on
// (every control, C1 ones too, and the characters that reorder text),
// and the JSON still reads back to the name.
func TestListPrintsHostileNamesSafely(t *testing.T) {
	l := api.FileList{Path: "/w"}
	for _, n := range hostileNames {
		l.Entries = append(l.Entries, api.FileEntry{Name: n, Type: api.FileTypeFile, MTime: time.Unix(0, 0)})
	}
	for _, format := range []string{"table", "json"} {
		var out bytes.Buffer
		c := &fsClient{Output: format}
		err := c.print(&out, l, func(tw *tabwriter.Writer) {
			for _, e := range l.Entries {
				entryRow(tw, e, e.Name)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if rawControl(out.String()) {
			t.Errorf("%s output carries a raw control or format character: %q", format, out.String())
		}
		if format == "json" {
			var back api.FileList
			if err := json.Unmarshal(out.Bytes(), &back); err != nil || len(back.Entries) != len(hostileNames) {
				t.Fatalf("json reads back as %+v, %v", back, err)
			}
			for i, e := range back.Entries {
				if e.Name != hostileNames[i] {
					t.Errorf("json name %q, want %q", e.Name, hostileNames[i])
				}
			}
		}
	}
	for _, n := range []string{"plain", "ü-ok", "with space", "日本"} {
		if got := shownName(n); got != n {
			t.Errorf("shownName(%q) = %q, want it as it is", n, got)
		}
	}
}
