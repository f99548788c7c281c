package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImage builds the image as `make image` does, from a freshly built
// static binary, and checks the tarball: loadable tags, the config
// (entrypoint, non-root user), a layer with no shell, and a binary that,
// extracted from the layer, runs.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "hiloop")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version=image-test", "-o", bin, "../..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	archive := filepath.Join(dir, "image.tar")
	digestFile := filepath.Join(dir, "digest")
	out, err := exec.Command("go", "run", ".", "-binary", bin, "-tag", "hiloop/hiloop:test", "-o", archive, "-digest-file", digestFile).CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./deploy/image: %v\n%s", err, out)
	}

	// docker load, kind load image-archive and ctr import read the tags
	// from manifest.json.
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(archive) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{"hiloop/hiloop:test"}) {
		t.Fatalf("manifest: %+v", m)
	}
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The digest printed, and pinned with the chart's image.digest, is the
	// one the tarball's image has, which a push that keeps the manifest
	// keeps.
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	written, _ := os.ReadFile(digestFile)
	if !strings.Contains(string(out), "digest "+digest.String()) || strings.TrimSpace(string(written)) != digest.String() {
		t.Errorf("digest %s; printed %q, written %q", digest, out, written)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/hiloop"}) || cf.Config.User != "65532:65532" || cf.OS != "linux" {
		t.Errorf("config: entrypoint %v, user %q, os %q", cf.Config.Entrypoint, cf.Config.User, cf.OS)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	extracted := filepath.Join(dir, "extracted")
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "hiloop" {
			if h.Mode&0o111 == 0 || h.Uid != 0 {
				t.Errorf("/hiloop: mode %o uid %d", h.Mode, h.Uid)
			}
			f, err := os.OpenFile(extracted, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(f, tr)
			f.Close()
		}
		if h.Name == "etc/passwd" {
			passwd, _ := io.ReadAll(tr)
			if !strings.Contains(string(passwd), ":65532:65532:") {
				t.Errorf("/etc/passwd has no user 65532: %s", passwd)
			}
		}
	}
	for _, n := range names {
		if strings.HasPrefix(n, "bin/") || strings.HasPrefix(n, "usr/") || strings.HasSuffix(n, "/sh") {
			t.Errorf("the image holds %s: it needs no shell or userland", n)
		}
	}
	out, err = exec.Command(extracted, "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hiloop image-test" {
		t.Fatalf("the binary from the layer: %v %q", err, out)
	}
	raw, _ := json.Marshal(cf.Config.Labels)
	if !strings.Contains(string(raw), `"org.opencontainers.image.version":"test"`) {
		t.Errorf("labels %s", raw)
	}
}
