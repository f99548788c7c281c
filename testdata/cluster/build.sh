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
bin="$root/cluster-k8s${KUBE_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}-as${AGENT_SANDBOX_VERSION}"
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
	(cd "$here/tools/$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$out" -ldflags "-s -w ${LDFLAGS:-}" "$@")
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

LDFLAGS="" build etcd -- etcd go.etcd.io/etcd/server/v3
LDFLAGS="" build kwok kwokctl -- kwok sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
LDFLAGS="" build agent-sandbox-controller -- agent-sandbox sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
LDFLAGS="" build helm -- helm helm.sh/helm/v3/cmd/helm
LDFLAGS="$stamp" build kube-apiserver kube-controller-manager kube-scheduler -- kubernetes \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler

echo "$bin"
