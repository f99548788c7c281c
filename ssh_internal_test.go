package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/api"
)

// hostKeyAPI answers GET /v1/ssh/host-key with publicKey as the host key.
func hostKeyAPI(t *testing.T, publicKey string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.HostKey{PublicKey: publicKey, Port: 2222})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestKnownHostsFromParsedKey: the known_hosts line is the parsed key
// written out again. An answer that smuggles a second line (a
// "@cert-authority *" that would trust any host key), options or anything
// but one key is refused by ssh-config and by sandbox ssh, which then
// writes no known_hosts file.
func TestKnownHostsFromParsedKey(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	good := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key)))

	out := &bytes.Buffer{}
	cmd := &SSHConfigCmd{Conn: Conn{URL: hostKeyAPI(t, good+" a comment\n")}}
	if err := cmd.Run(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	if want := "# ~/.ssh/known_hosts\nhiloop-127.0.0.1-2222 " + good + "\n"; !strings.HasSuffix(out.String(), want) {
		t.Fatalf("ssh-config printed:\n%s\nwant it to end in:\n%s", out, want)
	}

	for _, hostile := range []string{
		good + "\n@cert-authority * " + good,
		good + "\r\n@cert-authority * " + good,
		good + "\nhiloop-127.0.0.1-2222 " + good,
		`cert-authority,command="x" ` + good,
		"not a key",
		"",
	} {
		url := hostKeyAPI(t, hostile)
		out := &bytes.Buffer{}
		if err := (&SSHConfigCmd{Conn: Conn{URL: url}}).Run(context.Background(), out); err == nil || strings.Contains(out.String(), "cert-authority") {
			t.Errorf("ssh-config with host key %q: err %v, printed:\n%s", hostile, err, out)
		}
		cache := t.TempDir()
		t.Setenv("XDG_CACHE_HOME", cache)
		if err := (&SandboxSSHCmd{Conn: Conn{URL: url}, ID: "sbx_x"}).Run(context.Background()); err == nil {
			t.Errorf("sandbox ssh with host key %q ran", hostile)
		}
		if files, _ := filepath.Glob(filepath.Join(cache, "hiloop", "*")); len(files) > 0 {
			written, _ := os.ReadFile(files[0])
			t.Errorf("sandbox ssh with host key %q wrote %s:\n%s", hostile, files[0], written)
		}
	}

	for _, host := range []string{"evil.example\n@cert-authority *", "a b", "*", "h,other"} {
		if err := (&SSHConfigCmd{Conn: Conn{URL: hostKeyAPI(t, good)}, gatewayFlags: gatewayFlags{SSHHost: host}}).Run(context.Background(), &bytes.Buffer{}); err == nil {
			t.Errorf("ssh-config took the SSH host %q", host)
		}
	}
}
