package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// sshUser is one SSH identity registered for an organization, driving the
// stock OpenSSH client against the gateway with the pinned host key.
type sshUser struct {
	t     testing.TB
	in    *e2e.Instance
	token string
	key   string // private key file
	known string // known_hosts with the gateway's key under alias
}

const gatewayAlias = "hiloop-test-gateway"

// newSSHUser makes a key pair with ssh-keygen and registers it through the
// CLI for the organization of token.
func newSSHUser(t testing.TB, in *e2e.Instance, token string) *sshUser {
	t.Helper()
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test@hiloop", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	in.MustCLI(token, "ssh-key", "add", key+".pub")
	status, body := in.Call(token, "GET", "/v1/ssh/host-key", "")
	var hk struct {
		PublicKey string `json:"public_key"`
	}
	json.Unmarshal([]byte(body), &hk)
	if status != 200 || hk.PublicKey == "" {
		t.Fatalf("host key: %d %s", status, body)
	}
	known := filepath.Join(dir, "known_hosts")
	os.WriteFile(known, []byte(gatewayAlias+" "+hk.PublicKey+"\n"), 0o600)
	return &sshUser{t: t, in: in, token: token, key: key, known: known}
}

// args are the ssh options every test uses: this key only, host-key
// checking on against the pinned key, no config file, no prompts.
func (u *sshUser) args(extra ...string) []string {
	_, port, _ := net.SplitHostPort(u.in.SSHAddr)
	return append([]string{"-F", "/dev/null", "-p", port, "-i", u.key, "-o", "IdentitiesOnly=yes",
		"-o", "UserKnownHostsFile=" + u.known, "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HostKeyAlias=" + gatewayAlias,
		"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"}, extra...)
}

// ssh runs the OpenSSH client; it returns stdout, stderr and the exit code.
func (u *sshUser) ssh(stdin string, args ...string) (string, string, int) {
	u.t.Helper()
	cmd := exec.Command("ssh", args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		u.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		u.t.Fatalf("ssh %v hung:\n%s", args, e.String())
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// run runs CMD in sandbox id.
func (u *sshUser) run(id, cmd string) (string, string, int) {
	u.t.Helper()
	return u.ssh("", u.args(id+"@127.0.0.1", cmd)...)
}

func requireSSH(t testing.TB) {
	for _, b := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s is not installed (Debian: openssh-client)", b)
		}
	}
}

// TestSSHCommands runs commands through the gateway with the stock client:
// exact exit codes, stdin, a signal death, and the CLI's sandbox ssh.
func TestSSHCommands(t *testing.T) {
	requireSSH(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)

	if out, errOut, code := u.run(sb.ID, "echo hello; exit 42"); code != 42 || out != "hello\n" {
		t.Fatalf("exit 42: code %d out %q err %q", code, out, errOut)
	}
	if _, errOut, code := u.run(sb.ID, "true"); code != 0 {
		t.Fatalf("true: code %d err %q", code, errOut)
	}
	// kwok's exec never delivers stdin EOF (docs/local-cluster.md), so the
	// command reads one line rather than to the end.
	if out, errOut, code := u.ssh("first\nsecond\n", u.args(sb.ID+"@127.0.0.1", "head -n 1")...); code != 0 || out != "first\n" {
		t.Fatalf("stdin: code %d out %q err %q", code, out, errOut)
	}
	_, errOut, code := u.ssh("", u.args("-v", sb.ID+"@127.0.0.1", "kill -9 $$")...)
	if code != 255 || !strings.Contains(errOut, "exit-signal") {
		t.Fatalf("signal death: code %d, want 255 after an exit-signal; stderr:\n%s", code, errOut)
	}
	// hiloop sandbox ssh pins the host key in a file of its own and exits
	// with ssh's code.
	cmd := exec.Command(e2e.Binary(t), "sandbox", "ssh", "-i", u.key, sb.ID, "--", "exit 7")
	cmd.Env = append(in.Env(in.Token), "XDG_CACHE_HOME="+t.TempDir(), "SSH_AUTH_SOCK=")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
		t.Fatalf("hiloop sandbox ssh -- exit 7: %v\n%s", err, out)
	}
}

// TestSSHRefusals: what the gateway must refuse, refused, with the stock
// client where it can ask and a protocol-level client where it cannot.
func TestSSHRefusals(t *testing.T) {
	requireSSH(t)
	// The quarantine below gets past admission (WithoutAdmission): the
	// self-check must not run meanwhile. The refusals below are many
	// failed logins from one address, which penalties would cut short
	// (TestSSHPenaltyPerAddress tests those).
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--self-check-interval", "1h", "--ssh-penalties", "off")
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)
	orgB := in.NewOrg("sshb", 5, 5)
	b := newSSHUser(t, in, orgB)
	sbB := in.Create(orgB, "busybox", "--wait")

	// Org B registers org A's public key (public keys are public): that
	// neither blocks A nor tells B anything, only a second registration in
	// one organization conflicts, and the key reaches each organization's
	// sandboxes through that organization's registration alone.
	in.MustCLI(orgB, "ssh-key", "add", u.key+".pub")
	if _, errOut, code := in.CLI(orgB, "ssh-key", "add", u.key+".pub"); code == 0 || !strings.Contains(errOut, "ssh_key_registered") {
		t.Fatalf("registering the key twice in org B: code %d %s", code, errOut)
	}
	if _, errOut, code := u.run(sb.ID, "true"); code != 0 {
		t.Fatalf("A's key into A's sandbox once B registered it too: %d %q", code, errOut)
	}
	if _, errOut, code := u.run(sbB.ID, "true"); code != 0 {
		t.Fatalf("the key into B's sandbox through B's registration: %d %q", code, errOut)
	}
	in.MustCLI(orgB, "ssh-key", "delete", keyID(t, in, orgB, u.key))
	if _, errOut, code := u.run(sbB.ID, "true"); code != 255 || !strings.Contains(errOut, "Permission denied (publickey)") {
		t.Fatalf("the key into B's sandbox once B deleted its registration: %d %q", code, errOut)
	}
	if _, errOut, code := u.run(sb.ID, "true"); code != 0 {
		t.Fatalf("A's key into A's sandbox once B deleted its registration: %d %q", code, errOut)
	}

	ids := regexp.MustCompile(`sbx_[a-z0-9]+`)
	_, other, codeOther := b.run(sb.ID, "true")
	_, absent, codeAbsent := b.run("sbx_doesnotexist0000", "true")
	if codeOther != 255 || codeAbsent != 255 || ids.ReplaceAllString(other, "ID") != ids.ReplaceAllString(absent, "ID") ||
		!strings.Contains(other, "Permission denied (publickey)") {
		t.Fatalf("org B on org A's sandbox (%d %q) vs an absent id (%d %q)", codeOther, other, codeAbsent, absent)
	}
	stranger := newSSHUser(t, in, in.Token)
	in.MustCLI(in.Token, "ssh-key", "delete", keyID(t, in, in.Token, stranger.key))
	if _, errOut, code := stranger.run(sb.ID, "true"); code != 255 || !strings.Contains(errOut, "Permission denied (publickey)") {
		t.Fatalf("unregistered key: %d %q", code, errOut)
	}
	for _, method := range []string{"password", "keyboard-interactive"} {
		_, errOut, code := u.ssh("", u.args("-o", "PreferredAuthentications="+method, "-o", "PubkeyAuthentication=no", sb.ID+"@127.0.0.1", "true")...)
		if code != 255 || !strings.Contains(errOut, "Permission denied") {
			t.Errorf("%s auth: %d %q", method, code, errOut)
		}
	}
	// The default client negotiates AES-GCM; a client that will only speak
	// the ciphers the gateway leaves out is refused at key exchange.
	if _, errOut, code := u.ssh("", u.args("-v", sb.ID+"@127.0.0.1", "true")...); code != 0 ||
		!strings.Contains(errOut, "cipher: aes128-gcm@openssh.com") {
		t.Errorf("default client: %d, want AES-GCM negotiated: %q", code, errOut)
	}
	for _, cipher := range []string{"chacha20-poly1305@openssh.com", "aes128-ctr"} {
		if _, errOut, code := u.ssh("", u.args("-o", "Ciphers="+cipher, sb.ID+"@127.0.0.1", "true")...); code != 255 ||
			!strings.Contains(errOut, "no matching cipher") {
			t.Errorf("client offering only %s: %d %q", cipher, code, errOut)
		}
	}
	// -R is refused.
	if _, errOut, code := u.ssh("", u.args("-o", "ExitOnForwardFailure=yes", "-R", "0:localhost:1", "-N", sb.ID+"@127.0.0.1")...); code != 255 ||
		!strings.Contains(errOut, "remote port forwarding failed") {
		t.Errorf("-R: %d %q", code, errOut)
	}
	// -L to anything but loopback inside the sandbox is refused, and so is
	// loopback while the sandbox has no session helper.
	// (In the local cluster the API server listens on the host's loopback,
	// which stands in for the pod's; its in-cluster name is what a sandbox
	// would reach it by.)
	for _, dest := range []string{"169.254.169.254:80", "kubernetes.default.svc:443", "127.0.100.250:80", "localhost:8080"} {
		errOut := forwardOnce(t, u, sb.ID, dest)
		want := "only loopback"
		if strings.HasPrefix(dest, "localhost") {
			want = "session helper"
		}
		if !strings.Contains(errOut, "administratively prohibited") || !strings.Contains(errOut, want) {
			t.Errorf("-L to %s: stderr %q, want a refusal saying %q", dest, errOut, want)
		}
	}

	// What the stock client sends without asking for a reply is checked
	// with a protocol-level client: env, agent, X11, subsystems,
	// streamlocal, a port past 65535, -R.
	signer := loadSigner(t, u.key)
	_, port, _ := net.SplitHostPort(in.SSHAddr)
	conn, err := gossh.Dial("tcp", "127.0.0.1:"+port, &gossh.ClientConfig{User: sb.ID, Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sess, err := conn.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []struct {
		typ     string
		payload []byte
	}{
		{"env", gossh.Marshal(struct{ Name, Value string }{"LD_PRELOAD", "/tmp/x.so"})},
		{"auth-agent-req@openssh.com", nil},
		{"x11-req", gossh.Marshal(struct {
			Single        bool
			Proto, Cookie string
			Screen        uint32
		}{false, "MIT-MAGIC-COOKIE-1", "00", 0})},
		{"subsystem", gossh.Marshal(struct{ Name string }{"sftp"})},
	} {
		ok, err := sess.SendRequest(req.typ, true, req.payload)
		if err != nil || ok {
			t.Errorf("session request %s: ok %v err %v, want refused", req.typ, ok, err)
		}
	}
	sess.Close()
	if _, _, err := conn.OpenChannel("direct-streamlocal@openssh.com", gossh.Marshal(struct {
		Path, Reserved string
		ReservedPort   uint32
	}{"/var/run/docker.sock", "", 0})); err == nil {
		t.Error("direct-streamlocal was accepted")
	}
	_, _, err = conn.OpenChannel("direct-tcpip", gossh.Marshal(struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}{"127.0.0.1", 65537, "127.0.0.1", 1}))
	if err == nil || !strings.Contains(err.Error(), "65537") {
		t.Errorf("port 65537: %v, want a refusal naming the port", err)
	}
	if ok, _, err := conn.SendRequest("tcpip-forward", true, gossh.Marshal(struct {
		Addr string
		Port uint32
	}{"127.0.0.1", 0})); ok || err != nil {
		t.Errorf("tcpip-forward: ok %v err %v", ok, err)
	}

	// A stopped sandbox of one's own is admitted, then told what to do.
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	in.WaitState(in.Token, sb.ID, "stopped")
	if _, errOut, code := u.run(sb.ID, "true"); code != 255 || !strings.Contains(errOut, "hiloop sandbox start "+sb.ID) {
		t.Errorf("stopped sandbox: %d %q", code, errOut)
	}
	// And a quarantined one (someone past admission gave it the host's
	// network) is refused with the reason.
	restore := e2e.WithoutAdmission(t, in.NS)
	e2e.Kubectl(t, "patch", "sandbox", "-n", in.NS, k8sName(sbB.ID), "--type=merge", "-p", `{"spec":{"podTemplate":{"spec":{"hostNetwork":true}}}}`)
	e2e.Kubectl(t, "delete", "pod", "-n", in.NS, k8sName(sbB.ID), "--wait=false")
	in.WaitState(orgB, sbB.ID, "quarantined")
	restore()
	if _, errOut, code := b.run(sbB.ID, "true"); code != 255 || !strings.Contains(errOut, "quarantined") {
		t.Errorf("quarantined sandbox: %d %q", code, errOut)
	}
}

// TestSSHAuthorizesTheKeyThatSigned is the CVE-2024-45337 pattern with the
// stock client: the attacker offers the victim's public key (it has no
// private half, so it cannot sign), the gateway answers that the key would
// do, and the client goes on to authenticate with its own key. The
// session must act for the attacker's key, never the victim's.
func TestSSHAuthorizesTheKeyThatSigned(t *testing.T) {
	requireSSH(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	victimSB := in.Create(in.Token, "busybox", "--wait")
	victim := newSSHUser(t, in, in.Token)
	orgB := in.NewOrg("attacker", 5, 5)
	attackerSB := in.Create(orgB, "busybox", "--wait")
	attacker := newSSHUser(t, in, orgB)

	// The victim's public key alone: ssh offers it, and fails to load a
	// private key from it when the gateway answers that it would do.
	pubOnly := filepath.Join(t.TempDir(), "victim")
	b, _ := os.ReadFile(victim.key + ".pub")
	os.WriteFile(pubOnly+".pub", b, 0o600)
	os.WriteFile(pubOnly, b, 0o600)
	args := func(user string) []string {
		a := attacker.args("-v", "-i", pubOnly, user+"@127.0.0.1", "echo in")
		// The victim's key is offered first.
		for i := range a {
			if a[i] == attacker.key {
				a[i] = pubOnly
			} else if a[i] == pubOnly {
				a[i] = attacker.key
			}
		}
		return a
	}
	out, errOut, code := attacker.ssh("", args(victimSB.ID)...)
	if code != 255 || out != "" || !strings.Contains(errOut, "Permission denied") {
		t.Fatalf("attacker into the victim's sandbox: code %d out %q\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "Server accepts key: "+pubOnly) {
		t.Fatalf("the victim's key was not offered and accepted as the pattern needs; stderr:\n%s", errOut)
	}
	// Into its own sandbox the attacker gets in, as itself.
	out, errOut, code = attacker.ssh("", args(attackerSB.ID)...)
	if code != 0 || out != "in\n" {
		t.Fatalf("attacker into its own sandbox: code %d out %q\n%s", code, out, errOut)
	}
	attackerKey := keyID(t, in, orgB, attacker.key)
	if !regexp.MustCompile(`msg="ssh login" .*sandbox=` + attackerSB.ID + ` org=\S+ key=` + attackerKey).MatchString(in.Out.String()) {
		t.Fatalf("the login was not recorded for the attacker's own key %s:\n%s", attackerKey, in.Out.String())
	}
}

// TestSSHTerminal drives a PTY session in tmux: prompt, stty size before
// and after a resize, TERM from the PTY request, and exit 3.
func TestSSHTerminal(t *testing.T) {
	requireSSH(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)
	term := e2e.Tmux(t, 100, 30, "ssh -t "+strings.Join(u.args(sb.ID+"@127.0.0.1"), " ")+"; echo EXIT=$?; sleep 60")
	screen := func() (bool, error) { return false, fmt.Errorf("screen:\n%s", term.Screen()) }
	eventually.Within(t, "a prompt", 30*time.Second, func() (bool, error) {
		if regexp.MustCompile(`[$#] *$`).MatchString(strings.TrimSpace(term.Screen())) {
			return true, nil
		}
		return screen()
	})
	term.Type("stty size; echo TERM=$TERM")
	eventually.Within(t, "30 rows, 100 columns and TERM", 20*time.Second, func() (bool, error) {
		s := term.Screen()
		return strings.Contains(s, "30 100") && regexp.MustCompile(`TERM=(screen|tmux)`).MatchString(s), nil
	})
	term.Resize(120, 40)
	// The window change travels tmux, ssh, the gateway and the sandbox on
	// its own way: ask the sandbox's terminal again until it has it.
	var asked time.Time
	eventually.Within(t, "the resize", 30*time.Second, func() (bool, error) {
		if strings.Contains(term.Screen(), "40 120") {
			return true, nil
		}
		if time.Since(asked) > time.Second {
			term.Type("stty size")
			asked = time.Now()
		}
		return false, nil
	})
	term.Type("exit 3")
	eventually.Within(t, "exit 3", 20*time.Second, func() (bool, error) {
		if strings.Contains(term.Screen(), "EXIT=3") {
			return true, nil
		}
		return screen()
	})
}

// TestSSHSessionsEnd: deleting the SSH key, stopping or deleting the
// sandbox, and SIGTERM to serve each end a live session within seconds,
// with a message and a non-zero exit status.
func TestSSHSessionsEnd(t *testing.T) {
	requireSSH(t)
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	reap := func() { e2e.KillExecProcs(t, regexp.MustCompile("^sleep 31[1-5]$")) }
	reap()
	t.Cleanup(reap)
	sb := in.Create(in.Token, "busybox", "--wait")
	live := func(u *sshUser, id string, secs int) <-chan [2]string {
		cmd := exec.Command("ssh", u.args(id+"@127.0.0.1", "sleep "+strconv.Itoa(secs))...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var e bytes.Buffer
		cmd.Stderr = &e
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ch := make(chan [2]string, 1)
		go func() {
			cmd.Wait()
			ch <- [2]string{strconv.Itoa(cmd.ProcessState.ExitCode()), e.String()}
		}()
		eventually.Within(t, "session running", 30*time.Second, func() (bool, error) {
			return len(e2e.ExecProcs(t, regexp.MustCompile("^sleep "+strconv.Itoa(secs)+"$"))) > 0, nil
		})
		return ch
	}
	wait := func(ch <-chan [2]string, why string) {
		t.Helper()
		select {
		case r := <-ch:
			if r[0] == "0" || !strings.Contains(r[1], why) {
				t.Fatalf("session ended with %s, stderr %q; want non-zero saying %q", r[0], r[1], why)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the session did not end (%s)", why)
		}
	}

	u := newSSHUser(t, in, in.Token)
	ch := live(u, sb.ID, 311)
	in.MustCLI(in.Token, "ssh-key", "delete", keyID(t, in, in.Token, u.key))
	wait(ch, "revoked")

	u = newSSHUser(t, in, in.Token)
	ch = live(u, sb.ID, 312)
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	wait(ch, "stopped")
	in.MustCLI(in.Token, "sandbox", "start", sb.ID)
	in.WaitState(in.Token, sb.ID, "running")

	other := in.Create(in.Token, "busybox", "--wait")
	ch = live(u, other.ID, 314)
	in.MustCLI(in.Token, "sandbox", "delete", other.ID)
	wait(ch, "deleted")

	ch = live(u, sb.ID, 313)
	if err := in.Signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("serve after SIGTERM with a live SSH session: %v\n%s", err, in.Out.String())
	}
	wait(ch, "shutting down")
}

// keyID is the id of the registered SSH key whose private key file is key.
func keyID(t *testing.T, in *e2e.Instance, token, key string) string {
	t.Helper()
	pub, _ := os.ReadFile(key + ".pub")
	pk, _, _, _, err := gossh.ParseAuthorizedKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	_, body := in.Call(token, "GET", "/v1/ssh-keys", "")
	var l struct {
		Items []struct{ ID, Fingerprint string }
	}
	json.Unmarshal([]byte(body), &l)
	for _, k := range l.Items {
		if k.Fingerprint == gossh.FingerprintSHA256(pk) {
			return k.ID
		}
	}
	t.Fatalf("key %s is not registered: %s", key, body)
	return ""
}

func loadSigner(t testing.TB, key string) gossh.Signer {
	t.Helper()
	b, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.ParsePrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// forwardOnce runs ssh -N -L to dest, makes one connection through the
// forward, and returns what ssh said about it.
func forwardOnce(t *testing.T, u *sshUser, id, dest string) string {
	t.Helper()
	local := e2e.FreeAddr(t)
	cmd := exec.Command("ssh", u.args("-N", "-L", local+":"+dest, id+"@127.0.0.1")...)
	var e e2e.SyncBuffer
	cmd.Stderr = &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	eventually.Within(t, "forward listening", 20*time.Second, func() (bool, error) {
		c, err := net.Dial("tcp", local)
		if err != nil {
			return false, err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		c.Read(make([]byte, 1))
		c.Close()
		return strings.Contains(e.String(), "open failed"), nil
	})
	return e.String()
}

func k8sName(id string) string { return strings.ReplaceAll(id, "_", "-") }

// TestSSHKeepAlive: a client that stops answering (its process frozen) is
// dropped after the keepalives it misses, and the gateway's log carries no
// key material, only fingerprints.
func TestSSHKeepAlive(t *testing.T) {
	requireSSH(t)
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--ssh-keepalive", "1s")
	t.Cleanup(func() { e2e.KillExecProcs(t, regexp.MustCompile("^sleep 315$")) })
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)
	cmd := exec.Command("ssh", u.args("-o", "ServerAliveInterval=0", sb.ID+"@127.0.0.1", "sleep 315")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, "session running", 30*time.Second, func() (bool, error) {
		return len(e2e.ExecProcs(t, regexp.MustCompile("^sleep 315$"))) > 0, nil
	})
	cmd.Process.Signal(syscall.SIGSTOP)
	eventually.Within(t, "the gateway drops the silent client", 30*time.Second, func() (bool, error) {
		return strings.Contains(in.Out.String(), "stopped answering keepalives"), nil
	})
	cmd.Process.Signal(syscall.SIGCONT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		if cmd.ProcessState.ExitCode() == 0 {
			t.Fatal("ssh exited 0 after its connection was dropped")
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("ssh did not notice its connection was dropped")
	}
	pub, _ := os.ReadFile(u.key + ".pub")
	blob := strings.Fields(string(pub))[1]
	// All of serve's output: the admin key goes to its file, not to a
	// stdout that is not a terminal.
	log := in.Out.String()
	if strings.Contains(log, blob) || strings.Contains(log, in.Token) || strings.Contains(log, "hl_") {
		t.Fatalf("the log carries key material or an API key:\n%s", log)
	}
	if !strings.Contains(log, "fingerprint=SHA256:") {
		t.Fatal("the log names no key fingerprint")
	}
}
