// Package ociimage builds OCI images in-process, without a container daemon:
// a layer is a tarball written in memory with zero times, so the same files
// give the same image digest. deploy/image (the released image) and the
// local cluster (its busybox, pause, Python and agent images) build with it.
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// NonRoot is the uid and gid hiloop's image runs as (distroless's "nonroot").
const NonRoot = 65532

// Tar is a layer being written. Its entries carry the zero Unix time and
// uid and gid 0. Writes go to memory, so they do not fail.
type Tar struct {
	buf bytes.Buffer
	tw  *tar.Writer
}

// NewTar starts an empty layer.
func NewTar() *Tar {
	t := &Tar{}
	t.tw = tar.NewWriter(&t.buf)
	return t
}

var epoch = time.Unix(0, 0)

// Dir adds a directory; name is relative to the root and ends in "/".
func (t *Tar) Dir(name string, mode int64) {
	t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: epoch})
}

// File adds a regular file.
func (t *Tar) File(name string, mode int64, data []byte) {
	t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch})
	t.tw.Write(data)
}

// Link adds a hard link to target, a file added before it (both relative
// to the root). mode must be the target's: an extractor that applies each
// header's mode (containerd does) gives the one file the last link's.
func (t *Tar) Link(name, target string, mode int64) {
	t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: mode, ModTime: epoch})
}

// Symlink adds a symbolic link to target, which is taken as it is
// (relative to the link's directory, or absolute in the image).
func (t *Tar) Symlink(name, target string) {
	t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch})
}

// Layer closes the tarball and returns it as a gzip-compressed layer. The
// compressed bytes are kept, so the layer is compressed only once however
// often it is read (its digest, a push, an archive).
func (t *Tar) Layer() (v1.Layer, error) {
	if err := t.tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	data := t.buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompressedCaching)
}

// Config is what an image runs, and how it is labelled.
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
}

// Image is a linux image for arch (a GOARCH) of the given layers and
// config.
func Image(arch string, cfg Config, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	cf.Config.Entrypoint = cfg.Entrypoint
	cf.Config.Cmd = cfg.Cmd
	cf.Config.Env = cfg.Env
	cf.Config.User = cfg.User
	cf.Config.WorkingDir = cfg.WorkingDir
	cf.Config.Labels = cfg.Labels
	return mutate.ConfigFile(img, cf)
}

// Hiloop is the image of a static hiloop binary: one layer holding it at
// /hiloop and the /etc/passwd and /etc/group entries of its non-root user,
// with /tmp; no shell, no package manager. The binary needs no CA
// certificates: it speaks TLS only to the API server, whose CA comes with
// the service-account mount.
func Hiloop(bin []byte, arch, version string) (v1.Image, error) {
	t := NewTar()
	t.Dir("etc/", 0o755)
	t.File("etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot, NonRoot))
	t.File("etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", NonRoot))
	t.Dir("tmp/", 0o1777)
	t.File("hiloop", 0o755, bin)
	layer, err := t.Layer()
	if err != nil {
		return nil, err
	}
	return Image(arch, Config{
		Entrypoint: []string{"/hiloop"},
		Cmd:        []string{"version"},
		User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":   "hiloop",
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.source":  "https://github.com/hiloop/hiloop",
		},
	}, layer)
}

// WriteArchive writes img as a docker-archive tarball tagged tag (what
// `docker save` writes, and `docker load`, `kind load image-archive` and
// `ctr import` read). The file appears whole or not at all.
func WriteArchive(path string, tag name.Tag, img v1.Image) error {
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
