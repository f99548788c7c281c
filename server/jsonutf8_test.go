package server

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzJSONUTF8: of JSON strings that write no U+FFFD themselves,
// jsonUTF8 refuses exactly those encoding/json decodes with one: bytes
// that are not UTF-8 and lone surrogate escapes.
func FuzzJSONUTF8(f *testing.F) {
	for _, s := range []string{`"a"`, `"\udcff"`, `"\ud83d\ude00"`, `"\\udcff"`, `"\ud83d\\u0041"`, `"\ud83d"`, "\"\xff\"", `"\ufffd"`, `"\\\ud83d"`, `"\u00e9\ude00"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var s string
		if json.Unmarshal([]byte(body), &s) != nil {
			return
		}
		if strings.Contains(body, "\uFFFD") || strings.Contains(strings.ToLower(body), `\ufffd`) {
			return // a U+FFFD it wrote cannot be told from one coerced
		}
		coerced := strings.Contains(s, "\uFFFD")
		if err := jsonUTF8([]byte(body)); (err == nil) == coerced {
			t.Fatalf("%q decodes to %q; jsonUTF8 says %v", body, s, err)
		}
	})
}
