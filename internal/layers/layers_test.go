package layers

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/hiloop/hiloop"

// imports names, for every package of the module ("" is the hiloop binary,
// package main), exactly the hiloop packages its non-test code imports.
// An import missing here fails, and so does one listed here that the code
// no longer makes, so the map is the package graph as it is. Read it from
// the bottom up: the shared vocabulary (api, cluster, receipt, forward)
// imports nothing of hiloop's; the record (store) and the cluster adapter
// (k8s) sit on it; the isolation self-check (boundary) reads the cluster
// through the adapter; the core (control) speaks to the cluster only in
// cluster's vocabulary; the ways in (server, sshd) call the core; only app
// wires the parts together, for main (serve, dev) and for the end-to-end
// harness (internal/e2e), which runs a whole hiloop in-process.
var imports = map[string][]string{
	"":                     {"agent", "api", "app", "boundary", "cluster", "control", "k8s", "localcluster", "receipt", "store"},
	"agent":                {"forward"},
	"api":                  {},
	"app":                  {"boundary", "cluster", "control", "k8s", "metrics", "mirror", "receipt", "server", "sshd", "store"},
	"boundary":             {"cluster", "k8s"},
	"cluster":              {},
	"control":              {"api", "cluster", "metrics", "receipt", "store"},
	"control/controltest":  {"cluster", "k8s", "receipt", "store"},
	"deploy":               {},
	"deploy/image":         {"internal/ociimage"},
	"e2e":                  {},
	"forward":              {},
	"internal/benchplot":   {},
	"internal/benchspread": {},
	"internal/e2e":         {"app", "internal/eventually", "localcluster", "store"},
	"internal/eventually":  {},
	"internal/hungtest":    {},
	"internal/layers":      {},
	"internal/ociimage":    {},
	"internal/tlstest":     {},
	"k8s":                  {"cluster", "receipt", "store"},
	"localcluster":         {"boundary", "internal/ociimage", "k8s"},
	"metrics":              {"receipt"},
	"migrations":           {},
	"mirror":               {"k8s", "metrics", "receipt", "store"},
	"receipt":              {},
	"server":               {"api", "cluster", "control", "forward", "metrics", "receipt", "store"},
	"sshd":                 {"cluster", "control", "forward", "metrics", "receipt", "store"},
	"store":                {"api", "migrations", "receipt"},
}

// hidden names packages that must not reach the cluster adapter, directly
// or not: the core and the ways in link no Kubernetes.
var hidden = []string{"control", "server", "sshd"}

// TestCallsRunDownward: every package imports exactly the hiloop packages
// the map names, the core and the ways in reach no k8s nor any module of
// Kubernetes' (k8s.io, sigs.k8s.io), and the binary
// links no testing package.
func TestCallsRunDownward(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	got := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := rel(f[0])
		got[pkg] = []string{}
		for _, dep := range f[1:] {
			if d, ok := strings.CutPrefix(dep, mod+"/"); ok {
				got[pkg] = append(got[pkg], d)
			}
		}
	}
	for pkg, deps := range got {
		want, ok := imports[pkg]
		if !ok {
			t.Errorf("package %q is not in the map; place it in the graph", pkg)
			continue
		}
		for _, d := range deps {
			if !slices.Contains(want, d) {
				t.Errorf("%q imports %s, which the map does not allow", pkg, d)
			}
		}
		for _, d := range want {
			if !slices.Contains(deps, d) {
				t.Errorf("%q no longer imports %s: take the edge out of the map", pkg, d)
			}
		}
	}
	for pkg := range imports {
		if _, ok := got[pkg]; !ok {
			t.Errorf("the map names package %q, which does not exist", pkg)
		}
	}
	for _, pkg := range hidden {
		if reaches(pkg, "k8s") {
			t.Errorf("%s reaches k8s", pkg)
		}
	}

	for _, pkg := range hidden {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod+"/"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "k8s.io/") || strings.HasPrefix(dep, "sigs.k8s.io/") {
				t.Errorf("%s links Kubernetes' %s", pkg, dep)
			}
		}
	}

	out, err = exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if deps := strings.Fields(string(out)); slices.Contains(deps, "testing") {
		t.Error("the hiloop binary links package testing")
	}
}

// rel is a package's path inside the module; "" for the module's root.
func rel(importPath string) string {
	if importPath == mod {
		return ""
	}
	return strings.TrimPrefix(importPath, mod+"/")
}

// reaches reports whether pkg imports target through the map's edges.
func reaches(pkg, target string) bool {
	seen := map[string]bool{}
	var walk func(p string) bool
	walk = func(p string) bool {
		if seen[p] {
			return false
		}
		seen[p] = true
		for _, d := range imports[p] {
			if d == target || walk(d) {
				return true
			}
		}
		return false
	}
	return walk(pkg)
}
