// Command image builds hiloop's OCI image without a container daemon: one
// layer holding the static binary at /hiloop and the /etc/passwd and
// /etc/group entries of its non-root user, no shell, no package manager.
// It writes a docker-archive tarball, which `docker load`,
// `kind load image-archive` and `ctr import` accept.
//
//	go run ./deploy/image -binary bin/hiloop -tag hiloop/hiloop:0.1.0 -o bin/hiloop-image.tar
//
// The binary needs no CA certificates: it speaks TLS only to the API server,
// whose CA comes with the service-account mount.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// User is the uid and gid the image runs as (distroless's "nonroot").
const User = 65532

func main() {
	binary := flag.String("binary", "bin/hiloop", "the static hiloop binary (CGO_ENABLED=0)")
	tag := flag.String("tag", "hiloop/hiloop:dev", "the image's name and tag")
	out := flag.String("o", "bin/hiloop-image.tar", "the tarball to write")
	arch := flag.String("arch", runtime.GOARCH, "the binary's architecture")
	digestFile := flag.String("digest-file", "", "also write the image's manifest digest to this file")
	flag.Parse()
	digest, err := build(*binary, *tag, *arch, *out)
	if err == nil && *digestFile != "" {
		err = os.WriteFile(*digestFile, []byte(digest+"\n"), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Println(*out)
	// The digest the chart pins with image.digest, kept by a push that
	// keeps the manifest (crane push).
	fmt.Println("digest", digest)
}

// build writes the image's tarball and returns its manifest digest.
func build(binary, tag, arch, out string) (string, error) {
	ref, err := name.NewTag(tag)
	if err != nil {
		return "", err
	}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return "", err
	}
	img, err := Image(bin, arch, ref.TagStr())
	if err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return "", err
	}
	return digest.String(), os.Rename(tmp, out)
}

// Image is the image of a hiloop binary.
func Image(bin []byte, arch, version string) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(rootfs(bin))), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	cf.Config.Entrypoint = []string{"/hiloop"}
	cf.Config.Cmd = []string{"version"}
	cf.Config.User = fmt.Sprintf("%d:%d", User, User)
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "hiloop",
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.source":  "https://github.com/hiloop/hiloop",
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the layer: the binary and the user's entries. Times are zero
// so the same binary gives the same image.
func rootfs(bin []byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := func(name string) {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch})
	}
	file := func(name string, mode int64, data []byte) {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch})
		tw.Write(data)
	}
	dir("etc/")
	file("etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", User, User))
	file("etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", User))
	tmp := &tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch}
	tw.WriteHeader(tmp)
	file("hiloop", 0o755, bin)
	if err := tw.Close(); err != nil {
		panic(errors.Join(errors.New("rootfs"), err)) // writes to memory do not fail
	}
	return buf.Bytes()
}
