package sshd_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
	"github.com/hiloop/hiloop/store"
)

// stockKey writes a new key pair for the OpenSSH client and, unless
// stranger, registers it for the organization; it returns the ssh
// arguments that log in with it to g, host key pinned, from source.
func stockKey(t *testing.T, g *gateway, o store.Org, stranger bool) func(source, user, cmd string) []string {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("ssh is not installed (Debian: openssh-client)")
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	known := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(known, []byte("gw "+string(gossh.MarshalAuthorizedKey(g.host))), 0o600); err != nil {
		t.Fatal(err)
	}
	if !stranger {
		signer, err := gossh.NewSignerFromKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.db.AddSSHKey(t.Context(), o.ID, "stock", signer.PublicKey(), 100); err != nil {
			t.Fatal(err)
		}
	}
	host, port, _ := net.SplitHostPort(g.addr)
	return func(source, user, cmd string) []string {
		return []string{"-F", "/dev/null", "-b", source, "-p", port, "-i", keyFile, "-o", "IdentitiesOnly=yes",
			"-o", "UserKnownHostsFile=" + known, "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HostKeyAlias=gw",
			"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", user + "@" + host, cmd}
	}
}

// stock runs the OpenSSH client; it returns its exit code and stderr.
func stock(t *testing.T, args []string) (int, string) {
	cmd := exec.Command("ssh", args...)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Error(err)
		return -1, ""
	}
	timer := time.AfterFunc(clientDeadline, func() { cmd.Process.Kill() })
	defer timer.Stop()
	cmd.Wait()
	return cmd.ProcessState.ExitCode(), errOut.String()
}

// TestStockClientBurstWaits: a burst of stock OpenSSH clients from one
// address, past the key exchanges the gateway runs at once and past its
// cap per address, all log in and run their command: each one over a cap
// waits for a place instead of being reset during its key exchange.
func TestStockClientBurstWaits(t *testing.T) {
	const clients, sandboxes = 30, 10
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.MaxStartups, o.MaxStartupsPerSource, o.StartupQueue, o.StartupWait = sshd.Startups{Start: 2, Rate: 30, Full: 6}, 10, 64, 25*time.Second
	})
	org := g.org("a")
	login := stockKey(t, g, org, false)
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = g.sandbox(org, receipt.TransportSSH)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, errOut := stock(t, login("127.0.0.1", ids[i%sandboxes], "exit 0")); code != 0 {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("exit %d: %s", code, errOut))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Errorf("%d of %d stock clients at once from one address failed; first: %s", len(failures), clients, failures[0])
	}
	for _, reason := range []string{"startups", "startups_per_source", "startup_wait", "penalty"} {
		if n := refused(t, met, reason); n != 0 {
			t.Errorf("refused for %s: %d", reason, n)
		}
	}
}

// TestStockClientToldWhy: the stock client prints why the gateway refused
// it: an address penalised for failed logins is told so, naming the
// flag, while another address logs in.
func TestStockClientToldWhy(t *testing.T) {
	g, _ := limited(t, setup{}, func(*sshd.Options) {})
	org := g.org("a")
	id := g.sandbox(org, receipt.TransportSSH)
	good, bad := stockKey(t, g, org, false), stockKey(t, g, org, true)
	var errOut string
	for range 10 {
		var code int
		if code, errOut = stock(t, bad("127.0.0.2", id, "exit 0")); code != 255 {
			t.Fatalf("an unregistered key: exit %d %s", code, errOut)
		}
		if strings.Contains(errOut, "--ssh-penalties") {
			break
		}
	}
	if !strings.Contains(errOut, "Received disconnect") || !strings.Contains(errOut, "hiloop: this address is refused") {
		t.Errorf("the stock client after failed logins: %q, want the gateway's reason printed", errOut)
	}
	if code, errOut := stock(t, good("127.0.0.2", id, "exit 0")); code != 255 || !strings.Contains(errOut, "--ssh-penalties") {
		t.Errorf("a good key from the penalised address: exit %d %q", code, errOut)
	}
	if code, errOut := stock(t, good("127.0.0.1", id, "exit 0")); code != 0 {
		t.Errorf("a good key from another address: exit %d %q", code, errOut)
	}
}
