// Command image builds hiloop's OCI image without a container daemon: one
// layer holding the static binary at /hiloop and the /etc/passwd and
// /etc/group entries of its non-root user, no shell, no package manager.
// It writes a docker-archive tarball, which `docker load`,
// `kind load image-archive` and `ctr import` accept.
//
//	go run ./deploy/image -binary bin/hiloop -tag hiloop/hiloop:0.1.0 -o bin/hiloop-image.tar
//
// The image is internal/ociimage's Hiloop, which the local cluster builds too.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/hiloop/hiloop/internal/ociimage"
)

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
	img, err := ociimage.Hiloop(bin, arch, ref.TagStr())
	if err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	return digest.String(), ociimage.WriteArchive(out, ref, img)
}
