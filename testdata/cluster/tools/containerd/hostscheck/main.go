// Command hostscheck pulls images the way containerd's CRI does, with
// containerd's own code at the pinned version: it normalizes each name as
// the CRI does (busybox is docker.io/library/busybox:latest), resolves it
// through a certs.d directory of hosts.toml files (the CRI's
// registry.config_path), and fetches its manifest, config and layers,
// checking each digest. It prints "NAME DIGEST" for an image it pulled
// and "NAME error: ..." for one it could not. localcluster's tests run
// it against the local cluster's registry.
//
//	go run ./hostscheck -hosts DIR NAME...
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	distribution "github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func main() {
	hosts := flag.String("hosts", "", "the certs.d directory")
	flag.Parse()
	ctx := context.Background()
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: config.ConfigureHosts(ctx, config.HostOptions{HostDir: config.HostDirFromRoot(*hosts)}),
	})
	for _, name := range flag.Args() {
		digest, err := pull(ctx, resolver, name)
		if err != nil {
			fmt.Printf("%s error: %v\n", name, err)
			continue
		}
		fmt.Printf("%s %s\n", name, digest)
	}
}

func pull(ctx context.Context, resolver remotes.Resolver, name string) (string, error) {
	ref, err := distribution.ParseDockerRef(name)
	if err != nil {
		return "", err
	}
	resolved, desc, err := resolver.Resolve(ctx, ref.String())
	if err != nil {
		return "", err
	}
	fetcher, err := resolver.Fetcher(ctx, resolved)
	if err != nil {
		return "", err
	}
	raw, err := fetch(ctx, fetcher, desc)
	if err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	if m.Config.Digest == "" || len(m.Layers) == 0 {
		return "", fmt.Errorf("manifest %s: not an image manifest", desc.MediaType)
	}
	for _, d := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		if _, err := fetch(ctx, fetcher, d); err != nil {
			return "", fmt.Errorf("blob %s: %w", d.Digest, err)
		}
	}
	return desc.Digest.String(), nil
}

// fetch reads a blob whole and checks its size and digest.
func fetch(ctx context.Context, f remotes.Fetcher, d ocispec.Descriptor) ([]byte, error) {
	rc, err := f.Fetch(ctx, d)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != d.Size || d.Digest.Algorithm().FromBytes(b) != d.Digest {
		return nil, fmt.Errorf("%d bytes, digest %s: want %d, %s", len(b), d.Digest.Algorithm().FromBytes(b), d.Size, d.Digest)
	}
	return b, nil
}
