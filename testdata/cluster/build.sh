#!/usr/bin/env bash
# Builds the local test cluster's binaries at pinned versions from the Go module
# proxy and caches them outside the repository. Only missing binaries are built,
# so a warm run costs nothing. Prints the cache directory on its last line.
#
#   HILOOP_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/hiloop)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/versions.env"

root=${HILOOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hiloop}
bin="$root/cluster-k8s${KUBE_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}-as${AGENT_SANDBOX_VERSION}-gvisor${GVISOR_VERSION##*-}-containerd${CONTAINERD_VERSION}-cni${CNI_VERSION}"
mkdir -p "$bin"

# build NAME... -- DIR PKG...: builds PKGs from tools module DIR when any NAME is missing.
build() {
	local names=() missing=0
	while [ "$1" != "--" ]; do names+=("$1"); shift; done
	shift
	local dir=$1; shift
	for n in "${names[@]}"; do [ -x "$bin/$n" ] || missing=1; done
	[ "$missing" = 1 ] || return 0
	echo "building ${names[*]} ..." >&2
	local tmp
	tmp=$(mktemp -d "$bin/.build.XXXXXX")
	local start=$SECONDS
	# A single package is written under its command name (etcd's package is .../v3).
	local out="$tmp/"
	[ $# -eq 1 ] && out="$tmp/${names[0]}"
	# shellcheck disable=SC2086 # FLAGS is a list of go build flags
	(cd "$here/tools/$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$out" -ldflags "-s -w ${LDFLAGS:-}" ${FLAGS:-} "$@")
	for n in "${names[@]}"; do mv -f "$tmp/$n" "$bin/$n"; done
	rmdir "$tmp"
	echo "built ${names[*]} in $((SECONDS - start))s" >&2
}

v=k8s.io/component-base/version
cv=k8s.io/client-go/pkg/version
major=${KUBE_VERSION%%.*}
minor=${KUBE_VERSION#*.}; minor=${minor%%.*}
stamp="-X $v.gitVersion=v$KUBE_VERSION -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
stamp="$stamp -X $cv.gitVersion=v$KUBE_VERSION -X $cv.gitMajor=$major -X $cv.gitMinor=$minor -X $cv.gitTreeState=clean"

# gvisor_shim builds gVisor's containerd shim with one change: where the
# machine denies CAP_SYS_RESOURCE, the shim's lowering of its own
# oom_score_adj fails with EPERM, and the shim carries on instead of failing
# every sandbox (as containerd's own runc shim does). The change is made to
# a copy of the module, checked to apply, which a go.mod beside it replaces
# the module with (go build -overlay may not touch the module cache).
gvisor_shim() {
	[ -x "$bin/containerd-shim-runsc-v1" ] && return 0
	local dir work
	dir=$(cd "$here/tools/gvisor" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' gvisor.dev/gvisor)
	work=$(mktemp -d "$bin/.gvisor-shim.XXXXXX")
	cp -r "$dir" "$work/gvisor"
	chmod -R u+w "$work/gvisor"
	local f="$work/gvisor/pkg/shim/v1/manager.go"
	sed -i 's/if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {/if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil \&\& !os.IsPermission(err) {/' "$f"
	if cmp -s "$dir/pkg/shim/v1/manager.go" "$f"; then
		echo "build.sh: gVisor's shim no longer matches the oom_score_adj change; update gvisor_shim" >&2
		exit 1
	fi
	cp "$here/tools/gvisor/go.sum" "$work/go.sum"
	{ cat "$here/tools/gvisor/go.mod"; echo "replace gvisor.dev/gvisor => $work/gvisor"; } > "$work/go.mod"
	LDFLAGS="" FLAGS="-modfile=$work/go.mod" build containerd-shim-runsc-v1 -- gvisor gvisor.dev/gvisor/shim
	rm -rf "$work"
}

# debian_binary PACKAGE FILE NAME [static] copies FILE of Debian's PACKAGE,
# unpacked without installing it, to $bin/NAME; with "static", only if it
# is statically linked.
debian_binary() {
	local pkg=$1 file=$2 name=$3 static=${4:-}
	[ -x "$bin/$name" ] && return 0
	echo "fetching $pkg ..." >&2
	local tmp
	tmp=$(mktemp -d "$bin/.$name.XXXXXX")
	# Run as root, apt hands the download to its _apt user, which cannot
	# write into a private temporary directory.
	local get="apt-get -q -o APT::Sandbox::User=root download $pkg"
	if ! (cd "$tmp" && $get >&2); then
		# A fresh machine may have no package lists yet; root can fetch them.
		if [ "$(id -u)" != 0 ] || ! apt-get -q update >&2 || ! (cd "$tmp" && $get >&2); then
			echo "build.sh: apt-get download $pkg failed (run apt-get update first?)" >&2
			exit 1
		fi
	fi
	dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/root"
	# ldd fails on a static binary.
	if [ "$static" = static ] && ldd "$tmp/root/$file" >/dev/null 2>&1; then
		echo "build.sh: $pkg's $file is dynamically linked" >&2
		exit 1
	fi
	mv -f "$tmp/root/$file" "$bin/$name"
	rm -rf "$tmp"
}

# busybox must be static: the local cluster's busybox and pause images are
# made from it (localcluster/images.go), with no libc beside it. runc
# is only for the tests that show what runtime attestation does with a pod
# outside gVisor (localcluster.Options.RuncHandler); it runs on this host,
# with its libraries.
debian_binary busybox-static bin/busybox busybox static
debian_binary runc usr/sbin/runc runc

# python_rootfs unpacks Debian's Python 3.11 into the directory
# $bin/python-rootfs, the local cluster's Python image
# (localcluster/images.go adds busybox's layer under it): the
# interpreter, its whole standard library, and the shared libraries that
# python3.11 and the standard library's extension modules link (images.go
# refuses a rootfs where one is missing). The packages are unpacked, not
# installed: no maintainer script runs, so /usr/bin/python3 is made here as
# python3-minimal would, and no .pyc is compiled. Documentation, manuals,
# translations and glibc's iconv modules are left out.
python_rootfs() {
	[ -d "$bin/python-rootfs" ] && return 0
	local pkgs=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib media-types
		libc6 zlib1g libexpat1 libssl3 libffi8 libbz2-1.0 liblzma5 libcrypt1 libuuid1 libsqlite3-0
		libncursesw6 libtinfo6 libreadline8 libdb5.3 libnsl2 libtirpc3
		libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2)
	echo "fetching ${pkgs[*]} ..." >&2
	local tmp
	tmp=$(mktemp -d "$bin/.python-rootfs.XXXXXX")
	local get="apt-get -q -o APT::Sandbox::User=root download ${pkgs[*]}"
	if ! (cd "$tmp" && $get >&2); then
		if [ "$(id -u)" != 0 ] || ! apt-get -q update >&2 || ! (cd "$tmp" && $get >&2); then
			echo "build.sh: apt-get download ${pkgs[*]} failed (run apt-get update first?)" >&2
			exit 1
		fi
	fi
	local root="$tmp/root"
	mkdir -m 0755 "$root"
	for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$root"; done
	rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" \
		"$root/usr/share/locale" "$root/usr/share/lintian" "$root"/usr/lib/*/gconv
	ln -s python3.11 "$root/usr/bin/python3"
	mv "$root" "$bin/python-rootfs"
	rm -rf "$tmp"
}
python_rootfs

# The control plane, and the real node's parts in a second lane beside it: a
# Go build leaves a core idle in its long serial steps (linking), which the
# other lane fills.
(
	LDFLAGS="" build etcd -- etcd go.etcd.io/etcd/server/v3
	LDFLAGS="" build kwok kwokctl -- kwok sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
	LDFLAGS="" build agent-sandbox-controller -- agent-sandbox sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
	LDFLAGS="" build helm -- helm helm.sh/helm/v3/cmd/helm
	LDFLAGS="$stamp" build kube-apiserver kube-controller-manager kube-scheduler -- kubernetes \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
	LDFLAGS="$stamp" build kubelet -- kubernetes k8s.io/kubernetes/cmd/kubelet
) &
control=$!
(
	LDFLAGS="" build bridge host-local loopback -- cni \
		github.com/containernetworking/plugins/plugins/main/bridge \
		github.com/containernetworking/plugins/plugins/ipam/host-local \
		github.com/containernetworking/plugins/plugins/main/loopback
	LDFLAGS="" FLAGS="-tags no_btrfs,no_devmapper,no_zfs" build containerd containerd-shim-runc-v2 ctr -- containerd \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr
	LDFLAGS="" build runsc -- gvisor gvisor.dev/gvisor/runsc
	gvisor_shim
) &
node=$!
wait $control || exit 1
wait $node || exit 1

echo "$bin"
