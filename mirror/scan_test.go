package mirror

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMembers: the scan finds each member of an object and where its value
// ends, through escaped quotes and backslashes, nested brackets in
// strings, and keys with escapes.
func TestMembers(t *testing.T) {
	obj := []byte(` { "a" : "x\"}]" , "b\\":[1, {"c": "\\"}], "\u0064": {"e": [true, null, -1.5e3]}, "f":false}`)
	type member struct{ K, V string }
	var got []member
	if err := members(obj, func(k, v []byte) error {
		got = append(got, member{string(k), string(v)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []member{{"a", `"x\"}]"`}, {`b\`, `[1, {"c": "\\"}]`}, {"d", `{"e": [true, null, -1.5e3]}`}, {"f", "false"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
	for _, bad := range []string{`{"a" 1}`, `{"a": [1}`, `{"a": 1,}`, `{"a": {"b": 1]}`, `[1]`, `{"a": 1`} {
		if err := members([]byte(bad), func(k, v []byte) error { return nil }); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if _, err := skipValue([]byte(`{"a": "b`), 0); !errors.Is(err, errShort) {
		t.Errorf("a value cut short: %v, want errShort", err)
	}
}

// FuzzSkipValue: for any valid JSON value, the scan ends where the value
// ends.
func FuzzSkipValue(f *testing.F) {
	for _, s := range []string{`{"a":"\\\""}`, `[{"x":[]},"]"]`, `"\u0022"`, `123`, ` {"k": {"l": [null]}} `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !json.Valid([]byte(s)) {
			return
		}
		b := []byte(s + " ")
		i := skipSpace(b, 0)
		end, err := skipValue(b, i)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if rest := skipSpace(b, end); rest != len(b) {
			t.Fatalf("%q: ended at %d, before %q", s, end, b[end:])
		}
		var v any
		if err := json.Unmarshal(b[i:end], &v); err != nil {
			t.Fatalf("%q: the scanned value %q does not decode: %v", s, b[i:end], err)
		}
	})
}
