package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// parseServe parses serve's flags as kong does for `hiloop serve args...`.
func parseServe(t *testing.T, args ...string) (*ServeCmd, error) {
	t.Helper()
	var cli CLI
	parser, err := newParser(context.Background(), &cli, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, err = parser.Parse(append([]string{"serve"}, args...))
	return &cli.Serve, err
}

// sshLimits are the gateway's limits as serve's flags set them.
type sshLimits struct {
	LoginGrace, HelperDialTimeout, StartupWait                                                                time.Duration
	MaxStartups                                                                                               string
	MaxStartupsPerSource, StartupQueue, MaxConnsPerKey, MaxConnsPerOrg, MaxChannelsPerConn, MaxChannelsPerOrg int
	Penalties                                                                                                 string
}

func sshLimitsOf(s *ServeCmd) sshLimits {
	return sshLimits{s.SSHLoginGrace, s.SSHHelperDialTimeout, s.SSHStartupWait, s.SSHMaxStartups.String(), s.SSHMaxStartupsPerSource, s.SSHStartupQueue,
		s.SSHMaxConnsPerKey, s.SSHMaxConnsPerOrg, s.SSHMaxChannelsPerConn, s.SSHMaxChannelsPerOrg, s.SSHPenalties.String()}
}

// TestSSHLimitFlags: each of the gateway's limits is a flag with a default
// and an environment variable, and a negative or zero value is refused
// naming the flag.
func TestSSHLimitFlags(t *testing.T) {
	s, err := parseServe(t)
	if err != nil {
		t.Fatal(err)
	}
	const defaultPenalties = "authfail:5s,noauth:1s,grace-exceeded:10s,crash:30s,min:15s,max:10m0s,max-sources:16384"
	if diff := cmp.Diff(sshLimits{30 * time.Second, 10 * time.Second, 10 * time.Second, "64:30:256", 128, 256, 32, 256, 32, 128, defaultPenalties}, sshLimitsOf(s)); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	s, err = parseServe(t, "--ssh-login-grace=5s", "--ssh-helper-dial-timeout=2s", "--ssh-startup-wait=3s", "--ssh-max-startups=100",
		"--ssh-max-startups-per-source=3", "--ssh-startup-queue=9", "--ssh-max-conns-per-key=4", "--ssh-max-conns-per-org=5", "--ssh-max-channels-per-conn=6", "--ssh-max-channels-per-org=7",
		"--ssh-penalties=authfail:1s,max-sources:10")
	if err != nil {
		t.Fatal(err)
	}
	want := sshLimits{5 * time.Second, 2 * time.Second, 3 * time.Second, "100:100:100", 3, 9, 4, 5, 6, 7,
		"authfail:1s,noauth:1s,grace-exceeded:10s,crash:30s,min:15s,max:10m0s,max-sources:10"}
	if diff := cmp.Diff(want, sshLimitsOf(s)); diff != "" {
		t.Errorf("set by flags (-want +got):\n%s", diff)
	}
	t.Setenv("HILOOP_SSH_MAX_STARTUPS_PER_SOURCE", "7")
	t.Setenv("HILOOP_SSH_MAX_STARTUPS", "10:30:100")
	t.Setenv("HILOOP_SSH_PENALTIES", "off")
	if s, err = parseServe(t); err != nil || s.SSHMaxStartupsPerSource != 7 || s.SSHMaxStartups.String() != "10:30:100" || !s.SSHPenalties.Off {
		t.Errorf("HILOOP_SSH_MAX_STARTUPS_PER_SOURCE=7, HILOOP_SSH_MAX_STARTUPS=10:30:100, HILOOP_SSH_PENALTIES=off: %d, %s, %s, %v",
			s.SSHMaxStartupsPerSource, s.SSHMaxStartups, s.SSHPenalties, err)
	}
	for _, flag := range []string{"--ssh-login-grace", "--ssh-helper-dial-timeout", "--ssh-startup-wait", "--ssh-max-startups",
		"--ssh-max-startups-per-source", "--ssh-startup-queue", "--ssh-max-conns-per-key", "--ssh-max-conns-per-org", "--ssh-max-channels-per-conn", "--ssh-max-channels-per-org"} {
		for _, v := range []string{"0", "-1"} {
			if strings.HasSuffix(flag, "grace") || strings.HasSuffix(flag, "timeout") || strings.HasSuffix(flag, "wait") {
				v += "s"
			}
			if _, err := parseServe(t, flag+"="+v); err == nil || !strings.Contains(err.Error(), flag) {
				t.Errorf("%s=%s: %v, want refused naming the flag", flag, v, err)
			}
		}
	}
	for _, arg := range []string{"--ssh-max-startups=10:30", "--ssh-max-startups=10:0:100", "--ssh-max-startups=10:30:5", "--ssh-max-startups=a:b:c",
		"--ssh-penalties=authfail", "--ssh-penalties=bogus:1s", "--ssh-penalties=min:0s", "--ssh-penalties=max-sources:0", "--ssh-startup-wait=30s"} {
		flag, _, _ := strings.Cut(arg, "=")
		if _, err := parseServe(t, arg); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v, want refused naming the flag", arg, err)
		}
	}
}

// TestAPILimitFlags: the limits per organization and per address, the
// key limits and the bounds of waiting wakes are flags with defaults; a
// negative rate, or a key limit or bound below 1, is refused naming the
// flag.
func TestAPILimitFlags(t *testing.T) {
	s, err := parseServe(t)
	if err != nil {
		t.Fatal(err)
	}
	type apiLimits struct {
		Org, OrgCreate, Address float64
		APIKeys, SSHKeys        int
		Waits, OrgWaits         int
	}
	of := func(s *ServeCmd) apiLimits {
		return apiLimits{s.OrgRateLimit, s.OrgCreateRateLimit, s.AddressRateLimit, s.MaxAPIKeysPerOrg, s.MaxSSHKeysPerOrg,
			s.MaxWaitingWakesPerKey, s.MaxWaitingWakesPerOrg}
	}
	if diff := cmp.Diff(apiLimits{200, 40, 10, 100, 100, 16, 64}, of(s)); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	s, err = parseServe(t, "--org-rate-limit=0", "--org-create-rate-limit=0.5", "--address-rate-limit=0",
		"--max-api-keys-per-org=1", "--max-ssh-keys-per-org=7", "--max-waiting-wakes-per-key=2", "--max-waiting-wakes-per-org=3")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(apiLimits{0, 0.5, 0, 1, 7, 2, 3}, of(s)); diff != "" {
		t.Errorf("set by flags (-want +got):\n%s", diff)
	}
	t.Setenv("HILOOP_MAX_API_KEYS_PER_ORG", "12")
	if s, err = parseServe(t); err != nil || s.MaxAPIKeysPerOrg != 12 {
		t.Errorf("HILOOP_MAX_API_KEYS_PER_ORG=12: %d, %v", s.MaxAPIKeysPerOrg, err)
	}
	t.Setenv("HILOOP_MAX_WAITING_WAKES_PER_ORG", "9")
	if s, err = parseServe(t); err != nil || s.MaxWaitingWakesPerOrg != 9 {
		t.Errorf("HILOOP_MAX_WAITING_WAKES_PER_ORG=9: %d, %v", s.MaxWaitingWakesPerOrg, err)
	}
	for _, arg := range []string{"--org-rate-limit=-1", "--org-create-rate-limit=-1", "--address-rate-limit=-1",
		"--max-api-keys-per-org=0", "--max-ssh-keys-per-org=-3",
		"--max-waiting-wakes-per-key=0", "--max-waiting-wakes-per-org=-1"} {
		flag, _, _ := strings.Cut(arg, "=")
		if _, err := parseServe(t, arg); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v, want refused naming the flag", arg, err)
		}
	}
}

// TestHTTPLimitFlags: the HTTP listeners' limits are flags with defaults
// and environment variables; zero or negative is refused naming the flag.
func TestHTTPLimitFlags(t *testing.T) {
	s, err := parseServe(t)
	if err != nil || s.HTTPIOTimeout != time.Minute || s.HTTPMaxHeaderReads != 256 || s.HTTPMaxHeaderReadsPerSource != 32 {
		t.Errorf("defaults: %v %d %d, %v; want 1m 256 32", s.HTTPIOTimeout, s.HTTPMaxHeaderReads, s.HTTPMaxHeaderReadsPerSource, err)
	}
	t.Setenv("HILOOP_HTTP_IO_TIMEOUT", "7s")
	t.Setenv("HILOOP_HTTP_MAX_HEADER_READS_PER_SOURCE", "3")
	if s, err := parseServe(t, "--http-max-header-reads=9"); err != nil || s.HTTPIOTimeout != 7*time.Second || s.HTTPMaxHeaderReads != 9 || s.HTTPMaxHeaderReadsPerSource != 3 {
		t.Errorf("set: %v %d %d, %v; want 7s 9 3", s.HTTPIOTimeout, s.HTTPMaxHeaderReads, s.HTTPMaxHeaderReadsPerSource, err)
	}
	for _, arg := range []string{"--http-io-timeout=0s", "--http-io-timeout=-1s", "--http-max-header-reads=0", "--http-max-header-reads-per-source=-1"} {
		flag, _, _ := strings.Cut(arg, "=")
		if _, err := parseServe(t, arg); err == nil || !strings.Contains(err.Error(), flag+":") {
			t.Errorf("%s: %v, want refused naming the flag", arg, err)
		}
	}
}
