package e2e_test

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// sink reads each connection to EOF and answers one byte, so a sender
// knows everything arrived.
func sink(b *testing.B) string {
	return loopbackServer(b, func(c *net.TCPConn) {
		io.Copy(io.Discard, c)
		c.Write([]byte{1})
	})
}

// push sends n bytes to addr and waits for the sink's answer.
func push(b *testing.B, addr string, data []byte, n int) time.Duration {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	for sent := 0; sent < n; sent += len(data) {
		if _, err := c.Write(data); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// startSSHD runs OpenSSH's sshd on loopback with a throwaway config that
// accepts the user's key, for root.
func startSSHD(b *testing.B, pubKey string) string {
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
			b.Fatal("sshd is not installed (Debian: openssh-server; make bench installs it)")
		}
		sshd = "/usr/sbin/sshd"
	}
	dir := b.TempDir()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, "host")).CombinedOutput(); err != nil {
		b.Fatalf("ssh-keygen: %v %s", err, out)
	}
	os.WriteFile(filepath.Join(dir, "authorized_keys"), []byte(pubKey), 0o600)
	addr := e2e.FreeAddr(b)
	_, port, _ := net.SplitHostPort(addr)
	cfg := filepath.Join(dir, "sshd_config")
	os.WriteFile(cfg, []byte("ListenAddress 127.0.0.1\nPort "+port+"\nHostKey "+filepath.Join(dir, "host")+
		"\nAuthorizedKeysFile "+filepath.Join(dir, "authorized_keys")+"\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"+
		"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nAllowTcpForwarding yes\n"), 0o600)
	os.MkdirAll("/run/sshd", 0o755)
	cmd := exec.Command(sshd, "-D", "-e", "-f", cfg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &e2e.SyncBuffer{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	eventually.Within(b, "sshd listening", 20*time.Second, func() (bool, error) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil, fmt.Errorf("%v: %s", err, out.String())
	})
	return port
}

// BenchmarkForwardThroughput: 256 MB pushed through `ssh -N -L` into a
// sandbox (gateway, then the session helper) and through OpenSSH's own
// sshd on loopback, each against raw loopback TCP in the same run. The
// client runs with its default options in both cases.
func BenchmarkForwardThroughput(b *testing.B) {
	in, _, sb, u := forwardSandbox(b)
	dest := sink(b)
	_, destPort, _ := net.SplitHostPort(dest)
	pub, _ := os.ReadFile(u.key + ".pub")
	sshdPort := startSSHD(b, string(pub))
	_, gwPort, _ := net.SplitHostPort(in.SSHAddr)
	common := []string{"-F", "/dev/null", "-i", u.key, "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"}
	hiloopTunnel := tunnel(b, "localhost:"+destPort, append(append([]string{}, common...), "-p", gwPort, sb.ID+"@127.0.0.1"))
	sshdTunnel := tunnel(b, "127.0.0.1:"+destPort, append(append([]string{}, common...), "-p", sshdPort, "root@127.0.0.1"))
	data := make([]byte, 256<<10)
	rand.Read(data)
	const size = 256 << 20
	mbps := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
	b.ResetTimer()
	for range b.N {
		var raw, hl, sd []time.Duration
		for range 3 {
			raw = append(raw, push(b, dest, data, size))
			hl = append(hl, push(b, hiloopTunnel, data, size))
			sd = append(sd, push(b, sshdTunnel, data, size))
		}
		r, h, s := mbps(percentile(raw, 50)), mbps(percentile(hl, 50)), mbps(percentile(sd, 50))
		b.ReportMetric(r, "raw-MB/s")
		b.ReportMetric(h, "hiloop-MB/s")
		b.ReportMetric(s, "sshd-MB/s")
		b.ReportMetric(h/s, "hiloop/sshd")
		b.ReportMetric(h/r, "hiloop/raw")
		b.ReportMetric(s/r, "sshd/raw")
	}
}

// tunnel runs `ssh -N -L local:dest` with args and returns local.
func tunnel(b *testing.B, dest string, args []string) string {
	local := e2e.FreeAddr(b)
	cmd := exec.Command("ssh", append([]string{"-N", "-L", local + ":" + dest}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	e2e.WaitListening(b, "tunnel up", local)
	return local
}

// BenchmarkSSHRoundTrip: `ssh host true` through the gateway against
// `hiloop sandbox exec -- true`, both to the exit status.
func BenchmarkSSHRoundTrip(b *testing.B) {
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b))
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(b, in, in.Token)
	env := []string{"HILOOP_URL=" + in.URL, "HILOOP_TOKEN=" + in.Token}
	b.ResetTimer()
	for range b.N {
		var sh, ex []time.Duration
		for range 30 {
			sh = append(sh, timeCmd(b, nil, "ssh", u.args(sb.ID+"@127.0.0.1", "true")...))
			ex = append(ex, timeCmd(b, env, e2e.Binary(b), "sandbox", "exec", sb.ID, "--", "true"))
		}
		b.ReportMetric(float64(percentile(sh, 50).Microseconds())/1000, "ssh-p50-ms")
		b.ReportMetric(float64(percentile(ex, 50).Microseconds())/1000, "exec-p50-ms")
		b.ReportMetric(float64(percentile(sh, 50))/float64(percentile(ex, 50)), "ssh/exec")
		// The target: ssh host true no slower than the exec plus 20 ms.
		b.ReportMetric(float64((percentile(sh, 50)-percentile(ex, 50)).Microseconds())/1000, "ssh-minus-exec-ms")
	}
}

// BenchmarkSSHSessions200: 200 concurrent sessions (protocol-level
// clients, each running a command that prints and then waits): the p99 time
// from dial to the first byte of output, and the gateway's resident memory
// per live session.
func BenchmarkSSHSessions200(b *testing.B) {
	const n = 200
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b), "--exec-per-sandbox", "256", "--exec-per-org", "512")
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(b, in, in.Token)
	signer := loadSigner(b, u.key)
	_, port, _ := net.SplitHostPort(in.SSHAddr)
	b.ResetTimer()
	for range b.N {
		before := rssKB(b, in.Cmd.Process.Pid)
		ttfb := make([]time.Duration, n)
		var wg, ready sync.WaitGroup
		release := make(chan struct{})
		var failed sync.Map
		for i := range n {
			wg.Add(1)
			ready.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				once := sync.OnceFunc(ready.Done)
				defer once()
				c, err := gossh.Dial("tcp", "127.0.0.1:"+port, &gossh.ClientConfig{User: sb.ID, Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
					HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 60 * time.Second})
				if err != nil {
					failed.Store(i, err)
					return
				}
				defer c.Close()
				s, err := c.NewSession()
				if err != nil {
					failed.Store(i, err)
					return
				}
				out, _ := s.StdoutPipe()
				if err := s.Start("echo up; sleep 60"); err != nil {
					failed.Store(i, err)
					return
				}
				if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
					failed.Store(i, err)
					return
				}
				ttfb[i] = time.Since(start)
				once()
				<-release
			}()
		}
		ready.Wait()
		after := rssKB(b, in.Cmd.Process.Pid)
		close(release)
		wg.Wait()
		nf := 0
		failed.Range(func(k, v any) bool { nf++; b.Logf("session %v: %v", k, v); return true })
		if nf > 0 {
			b.Fatalf("%d of %d sessions failed", nf, n)
		}
		b.ReportMetric(float64(percentile(ttfb, 50).Microseconds())/1000, "ttfb-p50-ms")
		b.ReportMetric(float64(percentile(ttfb, 99).Microseconds())/1000, "ttfb-p99-ms")
		b.ReportMetric(float64(after-before)/n, "rss-KB/session")
	}
	e2e.KillExecProcs(b, regexp.MustCompile("^sleep 60$"))
}

// BenchmarkSSHBurst: 200 stock ssh clients at once from one address, each
// running `echo up`, through the gateway (across 50 sandboxes) and through
// OpenSSH's own sshd on loopback with its default MaxStartups (10:30:100):
// p50 and p99 of the time from starting the client to the first byte of
// its output, over the clients that got one, and how many failed. The
// figures are ratios to sshd in the same run; sshd drops connections past
// its MaxStartups, and those count as failed, not in its percentiles.
func BenchmarkSSHBurst(b *testing.B) {
	requireSSH(b)
	const clients, sandboxes = 200, 50
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b), burstFlags...)
	u, ids := burstSandboxes(b, in, sandboxes)
	pub, _ := os.ReadFile(u.key + ".pub")
	sshdPort := startSSHD(b, string(pub))
	plain := []string{"-F", "/dev/null", "-i", u.key, "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-p", sshdPort, "root@127.0.0.1", "echo up"}
	measure := func(args func(i int) []string) (p50, p99 time.Duration, failed int) {
		all := make([][]string, clients)
		for i := range all {
			all[i] = args(i)
		}
		var ttfb []time.Duration
		for _, r := range sshBurst(b, all) {
			if r.code != 0 || r.stdout != "up\n" {
				if failed++; failed == 1 {
					b.Logf("first failure: exit %d: %s", r.code, r.stderr)
				}
				continue
			}
			ttfb = append(ttfb, r.ttfb)
		}
		if len(ttfb) == 0 {
			return 0, 0, failed
		}
		return percentile(ttfb, 50), percentile(ttfb, 99), failed
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ResetTimer()
	for range b.N {
		h50, h99, hf := measure(func(i int) []string { return u.args(ids[i%sandboxes]+"@127.0.0.1", "echo up") })
		s50, s99, sf := measure(func(int) []string { return plain })
		b.ReportMetric(ms(h50), "hiloop-ttfb-p50-ms")
		b.ReportMetric(ms(h99), "hiloop-ttfb-p99-ms")
		b.ReportMetric(float64(hf), "hiloop-failed")
		b.ReportMetric(ms(s50), "sshd-ttfb-p50-ms")
		b.ReportMetric(ms(s99), "sshd-ttfb-p99-ms")
		b.ReportMetric(float64(sf), "sshd-failed")
		if s50 > 0 {
			b.ReportMetric(float64(h50)/float64(s50), "hiloop/sshd-p50")
			b.ReportMetric(float64(h99)/float64(s99), "hiloop/sshd-p99")
		}
	}
}
