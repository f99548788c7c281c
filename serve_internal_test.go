package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/app"
)

func TestCgroupMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		file, content string
		want          int64
	}{
		{"memory.max", "1073741824\n", 1 << 30},
		{"memory.max", "max\n", 0},
		{"memory/memory.limit_in_bytes", "536870912\n", 512 << 20},
		{"memory/memory.limit_in_bytes", "9223372036854771712\n", 0},
		{"", "", 0},
	} {
		root := t.TempDir()
		if tc.file != "" {
			os.MkdirAll(filepath.Dir(filepath.Join(root, tc.file)), 0o755)
			os.WriteFile(filepath.Join(root, tc.file), []byte(tc.content), 0o644)
		}
		if got := cgroupMemoryLimit(root); got != tc.want {
			t.Errorf("%s %q: %d, want %d", tc.file, tc.content, got, tc.want)
		}
	}
}

// TestTransportsForward: serve needs the session helper's image to back
// forward; dev runs its helpers itself and takes forward without one.
func TestTransportsForward(t *testing.T) {
	bin := t.TempDir()
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"serve", "--transports", "exec,ssh,forward"}, "--agent-image: the forward transport needs the session helper's image"},
		{[]string{"serve", "--transports", "exec,ssh,forward", "--agent-image", "hiloop/hiloop:1"}, ""},
		{[]string{"dev", "--cluster-bin", bin, "--transports", "exec,ssh,forward"}, ""},
		// dev still checks the rest.
		{[]string{"dev", "--cluster-bin", bin, "--transports", "exec,ssh,forward", "--ssh-listen", ""}, "--transports: ssh needs the gateway"},
	} {
		var cli CLI
		parser, err := newParser(context.Background(), &cli, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		_, err = parser.Parse(tc.args)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.wantErr)
		}
	}
}

// TestRuntimeAttestationFlag: serve attests by default; dev follows its
// node (on for the real one; off for the simulated one, whose pods run
// commands on this host) unless the flag or the environment says.
func TestRuntimeAttestationFlag(t *testing.T) {
	bin := t.TempDir()
	for _, tc := range []struct {
		args []string
		env  string // HILOOP_RUNTIME_ATTESTATION; "-" unset
		want bool
		// wantReal is dev's on the real node.
		wantReal bool
	}{
		{[]string{"serve"}, "-", true, false},
		{[]string{"serve", "--no-runtime-attestation"}, "-", false, false},
		{[]string{"serve"}, "false", false, false},
		{[]string{"serve", "--runtime-attestation"}, "false", true, false},
		{[]string{"dev", "--cluster-bin", bin}, "-", false, true},
		{[]string{"dev", "--cluster-bin", bin, "--runtime-attestation"}, "-", true, true},
		{[]string{"dev", "--cluster-bin", bin, "--no-runtime-attestation"}, "-", false, false},
		{[]string{"dev", "--cluster-bin", bin}, "true", true, true},
		{[]string{"dev", "--cluster-bin", bin}, "false", false, false},
		{[]string{"dev", "--cluster-bin", bin, "--no-runtime-attestation"}, "true", false, false},
	} {
		if tc.env == "-" {
			t.Setenv("HILOOP_RUNTIME_ATTESTATION", "")
			os.Unsetenv("HILOOP_RUNTIME_ATTESTATION")
		} else {
			t.Setenv("HILOOP_RUNTIME_ATTESTATION", tc.env)
		}
		var cli CLI
		parser, err := newParser(context.Background(), &cli, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parser.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		got := cli.Serve.RuntimeAttestation
		if tc.args[0] == "dev" {
			got = cli.Dev.attestation(false)
			if real := cli.Dev.attestation(true); real != tc.wantReal {
				t.Errorf("%v with HILOOP_RUNTIME_ATTESTATION %q on the real node: attestation %v, want %v", tc.args, tc.env, real, tc.wantReal)
			}
		}
		if got != tc.want {
			t.Errorf("%v with HILOOP_RUNTIME_ATTESTATION %q: attestation %v, want %v", tc.args, tc.env, got, tc.want)
		}
	}
}

// TestAddrFile: --addr-file holds the bound addresses as one JSON object,
// ssh and metrics only when on, and a second start replaces the file whole.
func TestAddrFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "addrs.json")
	for _, tc := range []struct {
		addrs app.Addrs
		want  string
	}{
		{app.Addrs{API: "127.0.0.1:1", SSH: "127.0.0.1:2", Metrics: "127.0.0.1:3"}, `{"api":"127.0.0.1:1","ssh":"127.0.0.1:2","metrics":"127.0.0.1:3"}` + "\n"},
		{app.Addrs{API: "[::1]:8080"}, `{"api":"[::1]:8080"}` + "\n"},
	} {
		if err := writeAddrFile(path, tc.addrs); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, string(raw)); diff != "" {
			t.Errorf("%+v (-want +got):\n%s", tc.addrs, diff)
		}
	}
	if err := writeAddrFile(filepath.Join(t.TempDir(), "missing", "addrs.json"), app.Addrs{API: "127.0.0.1:1"}); err == nil {
		t.Error("an address file in a missing directory was written")
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("the directory holds %d files, want the address file alone", len(ents))
	}
}

// TestPreviewFlags: --preview-domain is a lower-case domain name with an
// optional port and needs the forward transport; the URLs' scheme is
// http for localhost and *.localhost, https otherwise, unless set.
func TestPreviewFlags(t *testing.T) {
	fwd := []string{"serve", "--transports", "exec,ssh,forward", "--agent-image", "hiloop/hiloop:1"}
	for _, tc := range []struct {
		args       []string
		wantErr    string
		wantScheme string
	}{
		{append(fwd, "--preview-domain", "preview.example.com"), "", "https"},
		{append(fwd, "--preview-domain", "localhost:8080"), "", "http"},
		{append(fwd, "--preview-domain", "preview.localhost"), "", "http"},
		{append(fwd, "--preview-domain", "preview.localhost", "--preview-scheme", "https"), "", "https"},
		{append(fwd, "--preview-domain", "preview.lan", "--preview-scheme", "http"), "", "http"},
		{append(fwd, "--preview-domain", "Preview.Example.com"), "--preview-domain: ", ""},
		{append(fwd, "--preview-domain", "*.example.com"), "--preview-domain: ", ""},
		{append(fwd, "--preview-domain", "https://example.com"), "--preview-domain: ", ""},
		{append(fwd, "--preview-domain", "example.com:0"), "--preview-domain: ", ""},
		{append(fwd, "--preview-domain", "example.com", "--max-previews-per-sandbox", "0"), "--max-previews-per-sandbox: ", ""},
		{[]string{"serve", "--preview-domain", "preview.example.com"}, "--preview-domain: previews reach sandboxes over the forward transport", ""},
	} {
		var cli CLI
		parser, err := newParser(context.Background(), &cli, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		_, err = parser.Parse(tc.args)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.wantErr)
		case tc.wantScheme != "" && cli.Serve.PreviewURLScheme() != tc.wantScheme:
			t.Errorf("%v: scheme %s, want %s", tc.args, cli.Serve.PreviewURLScheme(), tc.wantScheme)
		}
	}
}
