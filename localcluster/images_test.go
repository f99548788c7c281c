package localcluster_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/hiloop/hiloop/internal/ociimage"
	"github.com/hiloop/hiloop/localcluster"
)

// sleepForever is the command the busybox and pause images run.
var sleepForever = []string{"/bin/sh", "-c", "trap 'kill $!; exit 0' TERM INT; /bin/sleep 2147483647 & wait"}

// startImages starts the registry with a hiloop "binary" of the given
// content and the given archives, closed by the test's cleanup.
func startImages(t *testing.T, binary string, archives ...string) *localcluster.Images {
	t.Helper()
	if os.Getenv("HILOOP_CLUSTER_BIN") == "" {
		t.Fatal("HILOOP_CLUSTER_BIN is not set: run the tests with make test (testdata/cluster/build.sh fetches busybox)")
	}
	bin := filepath.Join(t.TempDir(), "hiloop")
	if err := os.WriteFile(bin, fakeHiloop(t, binary), 0o755); err != nil {
		t.Fatal(err)
	}
	im, err := localcluster.StartImages(context.Background(), localcluster.ImageOptions{HiloopBinary: bin, Archives: archives})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := im.Close(); err != nil {
			t.Error(err)
		}
	})
	return im
}

// fakeHiloop is a static executable that stands in for the hiloop binary
// (the agent image takes only a static one): busybox, with tag appended so
// that each tag is another binary.
func fakeHiloop(t *testing.T, tag string) []byte {
	t.Helper()
	bb, err := os.ReadFile(filepath.Join(os.Getenv("HILOOP_CLUSTER_BIN"), "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	return append(bb, tag...)
}

// pull reads an image from the registry by its full name, as stored.
func pull(t *testing.T, im *localcluster.Images, full string) v1.Image {
	t.Helper()
	ref, err := name.ParseReference(im.Addr()+"/"+full, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pull %s: %v", full, err)
	}
	return img
}

// entry is a file of a layer.
type entry struct {
	typ  byte
	mode int64
	link string
	data []byte
}

// files reads an image's single layer.
func files(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	return layerFiles(t, layers[0])
}

// layerFiles reads a layer.
func layerFiles(t *testing.T, layer v1.Layer) map[string]entry {
	t.Helper()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out[h.Name] = entry{typ: h.Typeflag, mode: h.Mode, link: h.Linkname, data: data}
	}
}

func config(t *testing.T, img v1.Image) v1.Config {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" {
		t.Errorf("os %q", cf.OS)
	}
	return cf.Config
}

// TestImages pulls the busybox, pause and agent images from the registry
// and checks what they run and hold: the busybox taken from the layer
// runs its applets, and the command that keeps a sandbox running ends,
// with status 0, on SIGTERM.
func TestImages(t *testing.T) {
	im := startImages(t, "hiloop one")

	bb := pull(t, im, localcluster.BusyboxImage)
	cfg := config(t, bb)
	if diff := cmp.Diff(sleepForever, cfg.Cmd); diff != "" || cfg.Entrypoint != nil || cfg.User != "" {
		t.Errorf("busybox: entrypoint %q, user %q, cmd (-want +got):\n%s", cfg.Entrypoint, cfg.User, diff)
	}
	if !slices.Contains(cfg.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("busybox env %q", cfg.Env)
	}
	fs := files(t, bb)
	busybox := fs["bin/busybox"]
	if busybox.typ != tar.TypeReg || busybox.mode != 0o755 || len(busybox.data) == 0 {
		t.Fatalf("bin/busybox: type %c mode %o, %d bytes", busybox.typ, busybox.mode, len(busybox.data))
	}
	for _, applet := range []string{"sh", "sleep", "ls", "tar", "cat", "[", "env"} {
		if e := fs["bin/"+applet]; e.typ != tar.TypeLink || e.link != "bin/busybox" {
			t.Errorf("bin/%s: type %c to %q, want a hard link to bin/busybox", applet, e.typ, e.link)
		}
	}
	if e := fs["tmp/"]; e.typ != tar.TypeDir || e.mode != 0o1777 {
		t.Errorf("tmp/: type %c mode %o", e.typ, e.mode)
	}
	if e := fs["root/"]; e.typ != tar.TypeDir {
		t.Errorf("root/: type %c", e.typ)
	}
	passwd, group := string(fs["etc/passwd"].data), string(fs["etc/group"].data)
	if !strings.Contains(passwd, "root:x:0:0:") || !strings.Contains(passwd, "nobody:x:65534:65534:") ||
		!strings.Contains(group, "root:x:0:") || !strings.Contains(group, "nobody:x:65534:") {
		t.Errorf("passwd %q, group %q", passwd, group)
	}

	dir := t.TempDir()
	exe := filepath.Join(dir, "busybox")
	if err := os.WriteFile(exe, busybox.data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := (&exec.Cmd{Path: exe, Args: []string{"sh", "-c", "echo ok"}}).CombinedOutput()
	if err != nil || string(out) != "ok\n" {
		t.Fatalf("busybox sh from the layer: %v %q", err, out)
	}
	// The image's command, with the shell its /bin/sh is: once the sleep
	// is running the trap is set, and SIGTERM ends the shell with 0.
	sh := &exec.Cmd{Path: exe, Args: append([]string{"sh"}, sleepForever[1:]...)}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	child := childOf(t, sh.Process.Pid)
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	if err := sh.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := sh.Wait(); err != nil {
		t.Errorf("the sleep's shell on SIGTERM: %v, want exit 0", err)
	}

	pause := pull(t, im, localcluster.PauseImage)
	cfg = config(t, pause)
	if diff := cmp.Diff(sleepForever, cfg.Entrypoint); diff != "" || cfg.Cmd != nil {
		t.Errorf("pause: cmd %q, entrypoint (-want +got):\n%s", cfg.Cmd, diff)
	}
	if a, b := layerDigest(t, bb), layerDigest(t, pause); a != b {
		t.Errorf("pause's layer %s is not busybox's %s", b, a)
	}

	// The Python image is busybox's layer and Debian's Python over it,
	// with busybox's command.
	py := pull(t, im, localcluster.PythonImage)
	cfg = config(t, py)
	if diff := cmp.Diff(sleepForever, cfg.Cmd); diff != "" || cfg.Entrypoint != nil || !slices.Contains(cfg.Env, "LANG=C.UTF-8") ||
		!slices.Contains(cfg.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("python: entrypoint %q, env %q, cmd (-want +got):\n%s", cfg.Entrypoint, cfg.Env, diff)
	}
	layers, err := py.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("python's layers: %d %v", len(layers), err)
	}
	if a, b := layerDigest(t, bb), layerDigest(t, py); a != b {
		t.Errorf("python's first layer %s is not busybox's %s", b, a)
	}
	pyFiles := layerFiles(t, layers[1])
	if e := pyFiles["usr/bin/python3"]; e.typ != tar.TypeSymlink || e.link != "python3.11" {
		t.Errorf("usr/bin/python3: type %c to %q, want a symbolic link to python3.11", e.typ, e.link)
	}
	if e := pyFiles["usr/bin/python3.11"]; e.typ != tar.TypeReg || e.mode != 0o755 || !bytes.HasPrefix(e.data, []byte("\x7fELF")) {
		t.Errorf("usr/bin/python3.11: type %c mode %o", e.typ, e.mode)
	}
	for _, f := range []string{"usr/lib/python3.11/json/__init__.py", "usr/lib/python3.11/subprocess.py"} {
		if e := pyFiles[f]; e.typ != tar.TypeReg || len(e.data) == 0 {
			t.Errorf("%s: type %c, %d bytes", f, e.typ, len(e.data))
		}
	}
	for f := range pyFiles {
		if strings.HasPrefix(f, "usr/share/doc/") || strings.HasPrefix(f, "bin/") {
			t.Errorf("python's layer holds %s", f)
		}
	}

	sum := sha256.Sum256(fakeHiloop(t, "hiloop one"))
	if want := "hiloop.local/hiloop:" + hex.EncodeToString(sum[:])[:12]; im.AgentImage() != want {
		t.Fatalf("agent image %q, want %q", im.AgentImage(), want)
	}
	agent := pull(t, im, im.AgentImage())
	cfg = config(t, agent)
	if !slices.Equal(cfg.Entrypoint, []string{"/hiloop"}) || cfg.User != "65532:65532" {
		t.Errorf("agent: entrypoint %q, user %q", cfg.Entrypoint, cfg.User)
	}
	if e := files(t, agent)["hiloop"]; !bytes.Equal(e.data, fakeHiloop(t, "hiloop one")) || e.mode != 0o755 {
		t.Errorf("agent /hiloop: mode %o, %d bytes", e.mode, len(e.data))
	}
	if other := startImages(t, "hiloop two"); other.AgentImage() == im.AgentImage() {
		t.Errorf("another binary has the same image name %s", other.AgentImage())
	}

	want := []string{localcluster.BusyboxImage, im.AgentImage(), localcluster.PauseImage, localcluster.PythonImage}
	slices.Sort(want)
	if diff := cmp.Diff(want, im.Names()); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
}

// childOf waits until the process pid has a child and returns it.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			child, _ := strconv.Atoi(f[0])
			return child
		}
		time.Sleep(time.Millisecond) // the shell forks it next
	}
}

func layerDigest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		t.Fatalf("layers: %v", err)
	}
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func digest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// TestImageArchives serves the images of a docker-archive written as
// deploy/image writes one (two of them, one named without a registry) and
// of an OCI layout tarball, under the full names containerd gives their
// tags.
func TestImageArchives(t *testing.T) {
	dir := t.TempDir()
	tool, err := ociimage.Hiloop([]byte("tool"), "amd64", "v1")
	if err != nil {
		t.Fatal(err)
	}
	short, err := ociimage.Hiloop([]byte("short"), "amd64", "dev")
	if err != nil {
		t.Fatal(err)
	}
	oci, err := ociimage.Hiloop([]byte("oci"), "amd64", "2")
	if err != nil {
		t.Fatal(err)
	}
	docker1 := filepath.Join(dir, "tool.tar")
	if err := ociimage.WriteArchive(docker1, name.MustParseReference("example.com:5000/team/tool:v1").(name.Tag), tool); err != nil {
		t.Fatal(err)
	}
	docker2 := filepath.Join(dir, "short.tar")
	if err := ociimage.WriteArchive(docker2, name.MustParseReference("mytool:dev").(name.Tag), short); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(oci, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "example.com/oci/img:2"})); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "oci.tar")
	tarDir(t, filepath.Join(dir, "layout"), ociTar)

	im := startImages(t, "hiloop", docker1, docker2, ociTar)
	for full, img := range map[string]v1.Image{
		"example.com:5000/team/tool:v1": tool,
		"docker.io/library/mytool:dev":  short,
		"example.com/oci/img:2":         oci,
	} {
		if got, want := digest(t, pull(t, im, strings.Replace(full, ":5000", "_5000", 1))), digest(t, img); got != want {
			t.Errorf("%s: digest %s, want %s", full, got, want)
		}
		if !slices.Contains(im.Names(), full) {
			t.Errorf("%s is not in %q", full, im.Names())
		}
	}

	// containerd names the image's registry in ns when it asks a mirror.
	req, _ := http.NewRequest(http.MethodHead, "http://"+im.Addr()+"/v2/library/mytool/manifests/dev?ns=docker.io", nil)
	req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Docker-Content-Digest"); resp.StatusCode != http.StatusOK || got != digest(t, short) {
		t.Errorf("mirror request: %s, digest %q", resp.Status, got)
	}
}

// tarDir writes the files under dir as a tarball.
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBadImageArchive checks that an archive the registry cannot serve
// fails StartImages with an error naming the file and what is wrong.
func TestBadImageArchive(t *testing.T) {
	if os.Getenv("HILOOP_CLUSTER_BIN") == "" {
		t.Fatal("HILOOP_CLUSTER_BIN is not set: run the tests with make test (testdata/cluster/build.sh fetches busybox)")
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tarOf := func(files map[string]string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for n, data := range files {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(data))})
			tw.Write([]byte(data))
		}
		tw.Close()
		return buf.Bytes()
	}
	busyboxArchive := filepath.Join(dir, "busybox.tar")
	img, err := ociimage.Hiloop([]byte("not busybox"), "amd64", "latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.WriteArchive(busyboxArchive, name.MustParseReference("busybox").(name.Tag), img); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "absent.tar"), "no such file"},
		{"not a tarball", write("text.tar", bytes.Repeat([]byte("not a tarball\n"), 100)), "not a tarball"},
		{"no manifest", write("empty.tar", tarOf(map[string]string{"hello": "world"})), "neither a docker-archive"},
		{"bad manifest", write("bad.tar", tarOf(map[string]string{"manifest.json": "{"})), "manifest.json"},
		{"untagged", write("untagged.tar", tarOf(map[string]string{"manifest.json": `[{"Config":"c.json","Layers":[]}]`})), "has no tag"},
		{"layout without names", write("layout.tar", tarOf(map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": `{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":1,"annotations":{"org.opencontainers.image.ref.name":"latest"}}]}`})), "has no full name"},
		{"the cluster's own", busyboxArchive, "docker.io/library/busybox:latest is served already"},
		{"escaping layout", write("escape.tar", tarOf(map[string]string{"oci-layout": "{}", "index.json": "{}", "../evil": "x"})), "outside its root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			im, err := localcluster.StartImages(context.Background(), localcluster.ImageOptions{Archives: []string{tc.path}})
			if err == nil {
				im.Close()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), "--image-archive "+tc.path+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to name %s and say %q", err, tc.path, tc.want)
			}
		})
	}
}

// TestContainerdPullsThroughHosts writes the hosts directory and has
// containerd's own resolver and fetcher, at the pinned version, pull the
// images by the names a pod spec gives them (busybox) through it, as its
// CRI does with registry.config_path.
func TestContainerdPullsThroughHosts(t *testing.T) {
	im := startImages(t, "hiloop")
	hosts := t.TempDir()
	if err := im.WriteHostsDir(hosts); err != nil {
		t.Fatal(err)
	}
	toml, err := os.ReadFile(filepath.Join(hosts, "_default", "hosts.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(toml, []byte(`server = "http://`+im.Addr()+`"`)) || !bytes.Contains(toml, []byte(`capabilities = ["pull", "resolve"]`)) {
		t.Errorf("hosts.toml:\n%s", toml)
	}

	want := map[string]string{
		"busybox":               digest(t, pull(t, im, localcluster.BusyboxImage)),
		localcluster.PauseImage: digest(t, pull(t, im, localcluster.PauseImage)),
		im.AgentImage():         digest(t, pull(t, im, im.AgentImage())),
	}
	args := []string{"run", "./hostscheck", "-hosts", hosts}
	for n := range want {
		args = append(args, n)
	}
	args = append(args, "docker.io/library/absent:1")
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join("..", "testdata", "cluster", "tools", "containerd")
	// containerd logs to stderr (a 404 at info level).
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hostscheck: %v\n%s%s", err, out, stderr.Bytes())
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		n, rest, _ := strings.Cut(line, " ")
		got[n] = rest
	}
	if missing := got["docker.io/library/absent:1"]; !strings.Contains(missing, "not found") {
		t.Errorf("an image the registry lacks: %q, want not found", missing)
	}
	delete(got, "docker.io/library/absent:1")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pulled through containerd's resolver (-want +got):\n%s", diff)
	}
}

// TestPythonRootfsLinked checks that a Python root whose interpreter needs
// a library it lacks (zlib's, here) fails StartImages with an error naming
// the file and the library, and that a missing root is told as such.
func TestPythonRootfsLinked(t *testing.T) {
	src := os.Getenv("HILOOP_CLUSTER_BIN")
	if src == "" {
		t.Fatal("HILOOP_CLUSTER_BIN is not set: run the tests with make test (testdata/cluster/build.sh fetches busybox and Python)")
	}
	bin := t.TempDir()
	if err := os.Symlink(filepath.Join(src, "busybox"), filepath.Join(bin, "busybox")); err != nil {
		t.Fatal(err)
	}
	_, err := localcluster.StartImages(context.Background(), localcluster.ImageOptions{BinDir: bin})
	if err == nil || !strings.Contains(err.Error(), "python-rootfs") || !strings.Contains(err.Error(), "build.sh") {
		t.Fatalf("without python-rootfs: %v", err)
	}
	root := filepath.Join(bin, "python-rootfs")
	if out, err := exec.Command("cp", "-a", filepath.Join(src, "python-rootfs"), root).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	zlib, _ := filepath.Glob(filepath.Join(root, "*", "*", "*-linux-gnu*", "libz.so.1*"))
	more, _ := filepath.Glob(filepath.Join(root, "*", "*-linux-gnu*", "libz.so.1*"))
	if zlib = append(zlib, more...); len(zlib) == 0 {
		t.Fatal("python-rootfs holds no libz.so.1")
	}
	for _, f := range zlib {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	_, err = localcluster.StartImages(context.Background(), localcluster.ImageOptions{BinDir: bin})
	if err == nil || !strings.Contains(err.Error(), "usr/bin/python3.11 needs libz.so.1") {
		t.Fatalf("without zlib: %v", err)
	}
}
