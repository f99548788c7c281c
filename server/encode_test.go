package server

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
)

// TestEncodeOutput: a run's output is text while both streams are UTF-8,
// base64 (both) as soon as one is not, and a character the cap cut in two
// is dropped rather than making the output binary.
func TestEncodeOutput(t *testing.T) {
	capped := func(s string, max int) *capWriter {
		c := &capWriter{max: max}
		c.Write([]byte(s))
		return c
	}
	for _, tc := range []struct {
		name                string
		stdout, stderr      *capWriter
		out, errOut, coding string
	}{
		{"text", capped("h\u00e9llo\n", 100), capped("", 100), "h\u00e9llo\n", "", api.EncodingUTF8},
		{"binary stdout", capped("\xff\x00a", 100), capped("caf\u00e9", 100),
			base64.StdEncoding.EncodeToString([]byte("\xff\x00a")), base64.StdEncoding.EncodeToString([]byte("caf\u00e9")), api.EncodingBase64},
		{"binary stderr", capped("ok", 100), capped("\xc3", 100), "b2s=", "ww==", api.EncodingBase64},
		{"a character cut by the cap", capped("ab\u4e16", 4), capped("", 100), "ab", "", api.EncodingUTF8},
		{"a whole character at the cap", capped("a\u4e16z", 4), capped("", 100), "a\u4e16", "", api.EncodingUTF8},
		{"invalid before the cap", capped("\xffb\u4e16", 4), capped("", 100), base64.StdEncoding.EncodeToString([]byte("\xffb\xe4\xb8")), "", api.EncodingBase64},
		{"a lone continuation byte at the end, untruncated", capped("a\xa9", 100), capped("", 100), "Yak=", "", api.EncodingBase64},
		{"four-byte character cut after three", capped(strings.Repeat("x", 5)+"\U0001F600", 8), capped("", 100), "xxxxx", "", api.EncodingUTF8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, coding := encodeOutput(tc.stdout, tc.stderr)
			if out != tc.out || errOut != tc.errOut || coding != tc.coding {
				t.Fatalf("got %q %q %s, want %q %q %s", out, errOut, coding, tc.out, tc.errOut, tc.coding)
			}
		})
	}
}
