package localcluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/hiloop/hiloop/internal/ociimage"
)

// The images the cluster's real node pulls. The machine reaches no registry
// on the internet, so they are built in-process and served by a registry of
// the cluster's own (StartImages), which containerd uses for every host.
const (
	// BusyboxImage is what `busybox` resolves to: a static busybox with its
	// applets in /bin, whose command keeps a sandbox running.
	BusyboxImage = "docker.io/library/busybox:latest"
	// PythonImage is Debian's Python 3.11 (bookworm's python3.11 and its
	// standard library, from build.sh's python-rootfs) over the busybox
	// layer, with busybox's command. It is hiloop's own name, not Docker's
	// python image: that one is another build of Python, and its command
	// (python3) would end at once, ending the sandbox.
	PythonImage = "hiloop.local/python:3.11"
	// PauseImage is the pod sandbox image containerd starts first in every
	// pod (its pinned_images "sandbox").
	PauseImage = "hiloop.local/pause:1"
	// agentRepository is the repository of the hiloop agent image, tagged
	// with a short digest of the binary.
	agentRepository = "hiloop.local/hiloop"
)

// sleepForever is the command of the busybox and pause images: a sleep
// that outlives any test, under a shell that ends it on SIGTERM. The sleep
// alone, run as a PID namespace's init, would ignore SIGTERM (init gets no
// signal it has no handler for), so every pod deletion would wait out its
// whole grace period before the SIGKILL.
var sleepForever = []string{"/bin/sh", "-c", "trap 'kill $!; exit 0' TERM INT; /bin/sleep 2147483647 & wait"}

// busyboxPath is the PATH of the busybox, pause and Python images
// (Docker's busybox image has the same), which finds the Python image's
// /usr/bin/python3 before busybox's applets in /bin.
const busyboxPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ImageOptions configure StartImages.
type ImageOptions struct {
	// BinDir holds busybox and python-rootfs (from testdata/cluster/build.sh);
	// $HILOOP_CLUSTER_BIN when empty.
	BinDir string
	// HiloopBinary is the static hiloop binary of the agent image; when
	// empty there is no agent image.
	HiloopBinary string
	// Archives are image tarballs (`hiloop dev --image-archive`): each
	// image in them is served under every tag it carries. A docker-archive
	// (what `docker save` and deploy/image write) or an OCI image layout.
	Archives []string
}

// Images is a registry on 127.0.0.1 serving the cluster's images: busybox,
// pause, Python, the hiloop agent image, and those of the archives. An image is
// stored under its full name (docker.io/library/busybox), and a request
// that containerd sends to a mirror, which names the image's registry in
// the query (?ns=docker.io), is read as one for that full name.
type Images struct {
	addr   string
	agent  string
	names  []string
	server *http.Server
	blobs  string // the registry's blobs and unpacked OCI layouts

	closeOnce sync.Once
	closeErr  error
}

// StartImages builds the images, starts the registry and pushes them into
// it. On error nothing is left running.
func StartImages(ctx context.Context, o ImageOptions) (_ *Images, err error) {
	if o.BinDir == "" {
		o.BinDir = os.Getenv("HILOOP_CLUSTER_BIN")
	}
	if o.BinDir == "" {
		return nil, errors.New("images: HILOOP_CLUSTER_BIN is not set: build the cluster with testdata/cluster/build.sh (make cluster) and point it at the printed directory")
	}
	dir, err := os.MkdirTemp("", "hiloop-images-")
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	im := &Images{blobs: dir}
	defer func() {
		if err != nil {
			im.Close()
		}
	}()

	images, err := baseImages(ctx, o.BinDir)
	if err != nil {
		return nil, err
	}
	if o.HiloopBinary != "" {
		ref, img, err := agentImage(o.HiloopBinary)
		if err != nil {
			return nil, err
		}
		im.agent, images[ref] = ref, img
	}
	for i, path := range o.Archives {
		tagged, err := readArchive(path, filepath.Join(dir, fmt.Sprintf("layout-%d", i)))
		if err != nil {
			return nil, fmt.Errorf("images: --image-archive %s: %w", path, err)
		}
		for ref, img := range tagged {
			if _, ok := images[ref]; ok {
				return nil, fmt.Errorf("images: --image-archive %s: %s is served already (one of the cluster's own images, or from an earlier archive)", path, ref)
			}
			images[ref] = img
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	im.addr = ln.Addr().String()
	blobDir := filepath.Join(dir, "blobs")
	if err := os.MkdirAll(blobDir, 0o755); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	reg := registry.New(
		registry.Logger(log.New(io.Discard, "", 0)),
		registry.WithBlobHandler(registry.NewDiskBlobHandler(blobDir)),
	)
	im.server = &http.Server{Handler: mirrorNamespaces(reg), ErrorLog: log.New(io.Discard, "", 0)}
	go im.server.Serve(ln)

	for ref, img := range images {
		if err := im.push(ctx, ref, img); err != nil {
			return nil, err
		}
		im.names = append(im.names, ref)
	}
	slices.Sort(im.names)
	return im, nil
}

// baseImages are the cluster's own images, built from the busybox and
// the Python root under binDir: busybox, pause and Python, by reference.
func baseImages(ctx context.Context, binDir string) (map[string]v1.Image, error) {
	busybox, err := busyboxLayer(ctx, filepath.Join(binDir, "busybox"))
	if err != nil {
		return nil, err
	}
	arch := runtime.GOARCH
	bb, err := ociimage.Image(arch, ociimage.Config{Cmd: sleepForever, Env: []string{busyboxPath}, WorkingDir: "/"}, busybox)
	if err != nil {
		return nil, fmt.Errorf("images: busybox: %w", err)
	}
	pause, err := ociimage.Image(arch, ociimage.Config{Entrypoint: sleepForever, Env: []string{busyboxPath}, WorkingDir: "/"}, busybox)
	if err != nil {
		return nil, fmt.Errorf("images: pause: %w", err)
	}
	python, err := rootfsLayer(filepath.Join(binDir, "python-rootfs"))
	if err != nil {
		return nil, err
	}
	py, err := ociimage.Image(arch, ociimage.Config{Cmd: sleepForever, Env: []string{busyboxPath, "LANG=C.UTF-8"}, WorkingDir: "/"}, busybox, python)
	if err != nil {
		return nil, fmt.Errorf("images: python: %w", err)
	}
	return map[string]v1.Image{BusyboxImage: bb, PauseImage: pause, PythonImage: py}, nil
}

// agentImage is the session helper's image of the hiloop binary at path,
// and its reference, tagged by the binary's digest.
func agentImage(path string) (string, v1.Image, error) {
	bin, err := os.ReadFile(path)
	if err != nil {
		return "", nil, fmt.Errorf("images: the hiloop binary: %w", err)
	}
	// The session helper runs it in an image with nothing else in it.
	if err := checkStatic(bin); err != nil {
		return "", nil, fmt.Errorf("images: %s: %w: build hiloop with CGO_ENABLED=0 (make build does)", path, err)
	}
	sum := sha256.Sum256(bin)
	tag := hex.EncodeToString(sum[:])[:12]
	img, err := ociimage.Hiloop(bin, runtime.GOARCH, tag)
	if err != nil {
		return "", nil, fmt.Errorf("images: hiloop: %w", err)
	}
	return agentRepository + ":" + tag, img, nil
}

// Addr is the registry's host:port on 127.0.0.1.
func (im *Images) Addr() string { return im.addr }

// AgentImage is the name of the hiloop agent image
// (hiloop.local/hiloop:<12 hex digits of the binary's sha256>), or "" when
// ImageOptions.HiloopBinary was empty. A changed binary is a new tag.
func (im *Images) AgentImage() string { return im.agent }

// Names are the full names of every image served, sorted.
func (im *Images) Names() []string { return slices.Clone(im.names) }

// Close stops the registry and removes its storage.
func (im *Images) Close() error {
	im.closeOnce.Do(func() {
		if im.server != nil {
			im.closeErr = im.server.Close()
		}
		if err := os.RemoveAll(im.blobs); err != nil && im.closeErr == nil {
			im.closeErr = err
		}
	})
	return im.closeErr
}

// WriteHostsDir writes containerd's registry host configuration for the
// registry into dir, which containerd's CRI reads as
// [plugins.'io.containerd.cri.v1.images'.registry] config_path. Its
// _default/hosts.toml applies to every registry host (docker.io too:
// containerd 2.4 looks for <host>/ and then _default/), and names the
// registry as the server itself, not as a mirror in front of the real
// one, so no pull falls through to the internet: an image the registry
// lacks fails with its "not found".
func (im *Images) WriteHostsDir(dir string) error {
	d := filepath.Join(dir, "_default")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	if err := os.WriteFile(filepath.Join(d, "hosts.toml"), HostsTOML(im.addr), 0o644); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	return nil
}

// HostsTOML is the hosts.toml that points containerd at a registry at
// addr (host:port) over plain HTTP, for pulls only.
func HostsTOML(addr string) []byte {
	return fmt.Appendf(nil, "# The local cluster's registry (localcluster/images.go).\nserver = \"http://%s\"\ncapabilities = [\"pull\", \"resolve\"]\n", addr)
}

// push writes img to the registry under ref's full name.
func (im *Images) push(ctx context.Context, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("images: %s: %w", ref, err)
	}
	local, err := name.NewTag(im.addr+"/"+mirrorRepository(tag.Context())+":"+tag.TagStr(), name.Insecure)
	if err != nil {
		return fmt.Errorf("images: %s: %w", ref, err)
	}
	if err := remote.Write(local, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("images: push %s: %w", ref, err)
	}
	return nil
}

// mirrorRepository is where the registry keeps a repository: under its
// registry's host as containerd names it (docker.io, not
// index.docker.io), with a port's colon as an underscore.
func mirrorRepository(repo name.Repository) string {
	host := repo.RegistryStr()
	if host == name.DefaultRegistry {
		host = "docker.io"
	}
	return strings.ReplaceAll(host, ":", "_") + "/" + repo.RepositoryStr()
}

// mirrorNamespaces serves containerd's mirror requests: /v2/library/busybox/...
// with ?ns=docker.io is /v2/docker.io/library/busybox/... in the registry.
// A request without ns (a client that names the registry itself) is
// passed on as it is.
func mirrorNamespaces(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ns := r.URL.Query().Get("ns")
		rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
		if ns != "" && ok && rest != "" {
			host := strings.ReplaceAll(ns, ":", "_")
			if strings.ContainsAny(host, "/?#") {
				http.Error(w, "bad ns", http.StatusBadRequest)
				return
			}
			r = r.Clone(r.Context())
			r.URL.Path = "/v2/" + host + "/" + rest
			r.URL.RawPath = ""
		}
		next.ServeHTTP(w, r)
	})
}

// busyboxLayer is the layer of the busybox and pause images: the static
// busybox at /bin/busybox, a hard link to it in /bin for each applet it
// lists, /etc/passwd and /etc/group with root and nobody, /root and /tmp.
func busyboxLayer(ctx context.Context, path string) (v1.Layer, error) {
	bin, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("images: no %s: testdata/cluster/build.sh fetches it (Debian's busybox-static)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	if err := checkStatic(bin); err != nil {
		return nil, fmt.Errorf("images: %s: %w", path, err)
	}
	out, err := exec.CommandContext(ctx, path, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("images: %s --list: %w", path, err)
	}
	applets := strings.Fields(string(out))
	slices.Sort(applets)
	applets = slices.Compact(applets)

	t := ociimage.NewTar()
	t.Dir("bin/", 0o755)
	t.File("bin/busybox", 0o755, bin)
	for _, a := range applets {
		if a == "busybox" || !appletName.MatchString(a) {
			continue
		}
		t.Link("bin/"+a, "bin/busybox", 0o755)
	}
	t.Dir("etc/", 0o755)
	t.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	t.File("etc/group", 0o644, []byte("root:x:0:\nnobody:x:65534:\n"))
	t.Dir("root/", 0o700)
	t.Dir("tmp/", 0o1777)
	layer, err := t.Layer()
	if err != nil {
		return nil, fmt.Errorf("images: busybox: %w", err)
	}
	return layer, nil
}

// rootfsLayer is a layer of the directory root's directories, regular
// files and symbolic links, in order, with their permission bits. Every
// dynamically linked ELF file in it must find its interpreter and each
// library it needs in root itself: the image has no other.
func rootfsLayer(root string) (v1.Layer, error) {
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("images: no %s: testdata/cluster/build.sh unpacks it (Debian's python3.11)", root)
	}
	t := ociimage.NewTar()
	var elfs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := int64(info.Mode().Perm())
		switch {
		case d.IsDir():
			t.Dir(rel+"/", mode)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			t.Symlink(rel, target)
		case d.Type().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			t.File(rel, mode, data)
			if bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
				elfs = append(elfs, rel)
			}
		default:
			return fmt.Errorf("%s is neither a file, a directory nor a symbolic link", rel)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", root, err)
	}
	for _, rel := range elfs {
		if err := checkLinked(root, rel); err != nil {
			return nil, fmt.Errorf("images: %s: %w", root, err)
		}
	}
	layer, err := t.Layer()
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", root, err)
	}
	return layer, nil
}

// checkLinked reports an error unless the ELF file rel of root finds its
// interpreter and every library it needs in root's library directories:
// lib and usr/lib, and their multiarch directories (lib/x86_64-linux-gnu),
// which Debian's loader searches without an ld.so.cache.
func checkLinked(root, rel string) error {
	f, err := elf.Open(filepath.Join(root, rel))
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		interp, err := io.ReadAll(p.Open())
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if !existsIn(root, string(bytes.TrimRight(interp, "\x00"))) {
			return fmt.Errorf("%s: its interpreter %s is missing", rel, bytes.TrimRight(interp, "\x00"))
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	dirs := []string{"/lib", "/usr/lib"}
	for _, d := range []string{"lib", "usr/lib"} {
		multi, _ := filepath.Glob(filepath.Join(root, d, "*-linux-gnu*"))
		for _, m := range multi {
			dirs = append(dirs, "/"+d+"/"+filepath.Base(m))
		}
	}
	for _, lib := range libs {
		if !slices.ContainsFunc(dirs, func(d string) bool { return existsIn(root, d+"/"+lib) }) {
			return fmt.Errorf("%s needs %s, which no library directory holds", rel, lib)
		}
	}
	return nil
}

// existsIn says whether the absolute path p names a file in the tree at
// root, following symbolic links inside the tree (an absolute link's
// target is taken in the tree too).
func existsIn(root, p string) bool {
	for range 40 {
		p = filepath.Clean("/" + p) // a ".." stops at root
		info, err := os.Lstat(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			return false
		}
		if info.Mode()&fs.ModeSymlink == 0 {
			return true
		}
		target, err := os.Readlink(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			return false
		}
		if !strings.HasPrefix(target, "/") {
			target = filepath.ToSlash(filepath.Join(filepath.Dir(p), target))
		}
		p = target
	}
	return false
}

// appletName is what an applet's name may be: a file name in /bin ("[" and
// "[[" included).
var appletName = regexp.MustCompile(`^[][A-Za-z0-9_.+-]+$`)

// checkStatic reports an error unless bin is an ELF executable without an
// interpreter: the images have no libc.
func checkStatic(bin []byte) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked: the images need a static busybox (Debian's busybox-static)")
		}
	}
	return nil
}

// readArchive reads the images of a tarball and returns them by the full
// name of each tag they carry. A docker-archive is read in place; an OCI
// image layout is unpacked into dir first.
func readArchive(path, dir string) (map[string]v1.Image, error) {
	names, err := tarNames(path)
	if err != nil {
		return nil, err
	}
	switch {
	case names["manifest.json"]:
		return readDockerArchive(path)
	case names["index.json"] && names["oci-layout"]:
		if err := unpack(path, dir); err != nil {
			return nil, err
		}
		return readLayout(dir)
	default:
		return nil, errors.New("neither a docker-archive (no manifest.json) nor an OCI image layout (no index.json and oci-layout)")
	}
}

// tarNames are the names of the regular files in a tarball.
func tarNames(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("not a tarball: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			names[filepath.Clean(h.Name)] = true
		}
	}
	return names, nil
}

func readDockerArchive(path string) (map[string]v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("manifest.json: %w", err)
	}
	images := map[string]v1.Image{}
	for i, d := range m {
		if len(d.RepoTags) == 0 {
			return nil, fmt.Errorf("image %d (%s) has no tag: save it by name (docker save NAME:TAG)", i+1, d.Config)
		}
		for _, t := range d.RepoTags {
			tag, err := name.NewTag(t)
			if err != nil {
				return nil, fmt.Errorf("tag %q: %w", t, err)
			}
			img, err := tarball.Image(opener, &tag)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t, err)
			}
			if _, err := img.Digest(); err != nil {
				return nil, fmt.Errorf("%s: %w", t, err)
			}
			images[fullName(tag)] = img
		}
	}
	return images, nil
}

// readLayout reads the images of an OCI layout's index.json that carry a
// full name: containerd's io.containerd.image.name, or an
// org.opencontainers.image.ref.name that is a whole reference, not just a
// tag. An index entry that is itself an index (several platforms) gives
// its image for this machine's platform.
func readLayout(dir string) (map[string]v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	images := map[string]v1.Image{}
	for _, d := range im.Manifests {
		ref := d.Annotations["io.containerd.image.name"]
		if ref == "" {
			ref = d.Annotations["org.opencontainers.image.ref.name"]
		}
		if ref == "" || !strings.ContainsAny(ref, ":/") {
			return nil, fmt.Errorf("image %s has no full name (io.containerd.image.name, or org.opencontainers.image.ref.name as NAME:TAG)", d.Digest)
		}
		tag, err := name.NewTag(ref)
		if err != nil {
			return nil, fmt.Errorf("image name %q: %w", ref, err)
		}
		var img v1.Image
		if d.MediaType.IsIndex() {
			img, err = platformImage(idx, d.Digest)
		} else {
			img, err = idx.Image(d.Digest)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		images[fullName(tag)] = img
	}
	if len(images) == 0 {
		return nil, errors.New("index.json lists no image")
	}
	return images, nil
}

// platformImage is the linux image for this machine's architecture in the
// index h of idx.
func platformImage(idx v1.ImageIndex, h v1.Hash) (v1.Image, error) {
	sub, err := idx.ImageIndex(h)
	if err != nil {
		return nil, err
	}
	m, err := sub.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
			img, err := sub.Image(d.Digest)
			if err == nil {
				// Only the platforms that were saved have their blobs.
				if _, err = img.Layers(); err == nil {
					return img, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no linux/%s image", runtime.GOARCH)
}

// fullName is a tag's name as containerd normalizes it: busybox is
// docker.io/library/busybox:latest.
func fullName(tag name.Tag) string {
	repo := tag.Context()
	host := repo.RegistryStr()
	if host == name.DefaultRegistry {
		host = "docker.io"
	}
	return host + "/" + repo.RepositoryStr() + ":" + tag.TagStr()
}

// unpack writes the regular files and directories of a tarball under dir,
// refusing names that leave it.
func unpack(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not a tarball: %w", err)
		}
		if !filepath.IsLocal(h.Name) {
			return fmt.Errorf("the tarball holds %q, outside its root", h.Name)
		}
		target := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
