package e2e_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/internal/e2e"
)

// nodeModules installs the TypeScript SDK's dev dependencies (typescript,
// @types/node) with npm ci from its package-lock.json, once per lock, into
// hiloop's cache ($HILOOP_CACHE, else ~/.cache/hiloop: npm-<hash>),
// outside the repository,
// and returns that node_modules directory.
func nodeModules(t testing.TB) string {
	t.Helper()
	var sum []byte
	h := sha256.New()
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(e2e.Path(t, "sdk/typescript/"+f))
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	sum = h.Sum(nil)
	// The cluster's binaries' cache (testdata/cluster/build.sh).
	cache := os.Getenv("HILOOP_CACHE")
	if cache == "" {
		user, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(user, "hiloop")
	}
	dir := filepath.Join(cache, "npm-"+hex.EncodeToString(sum[:8]))
	mods := filepath.Join(dir, "node_modules")
	// npm ci writes node_modules/.package-lock.json last: its presence
	// says an earlier install finished.
	if _, err := os.Stat(filepath.Join(mods, ".package-lock.json")); err == nil {
		return mods
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".npm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{"package.json", "package-lock.json"} {
		copyFile(t, e2e.Path(t, "sdk/typescript/"+f), filepath.Join(tmp, f))
	}
	ci := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	ci.Dir = tmp
	if out, err := ci.CombinedOutput(); err != nil {
		t.Fatalf("npm ci (sdk/typescript): %v\n%s", err, out)
	}
	// Another test process may have finished first: either install serves.
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, serr := os.Stat(filepath.Join(mods, ".package-lock.json")); serr != nil {
			t.Fatal(err)
		}
	}
	return mods
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies the regular files under the directory from to to.
func copyTree(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		r, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		copyFile(t, p, filepath.Join(to, r))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// installTypeScript installs the TypeScript SDK as a user does: packed
// with npm pack from the tree (which compiles it with the locked tsc,
// offline) and unpacked into node_modules/hiloop of a directory of its
// own, which it returns; its node_modules links the dev dependencies
// (typescript, @types) too, for test programs to be compiled there.
func installTypeScript(t testing.TB) string {
	t.Helper()
	mods := nodeModules(t)
	work := t.TempDir()
	pkg := filepath.Join(work, "pkg")
	for _, f := range []string{"package.json", "package-lock.json", "tsconfig.json"} {
		copyFile(t, e2e.Path(t, "sdk/typescript/"+f), filepath.Join(pkg, f))
	}
	copyTree(t, e2e.Path(t, "sdk/typescript/src"), filepath.Join(pkg, "src"))
	if err := os.Symlink(mods, filepath.Join(pkg, "node_modules")); err != nil {
		t.Fatal(err)
	}
	pack := exec.Command("npm", "pack", "--offline", "--pack-destination", work)
	pack.Dir = pkg
	var stderr strings.Builder
	pack.Stderr = &stderr
	out, err := pack.Output()
	names := strings.Fields(string(out))
	if err != nil || len(names) == 0 {
		t.Fatalf("npm pack (sdk/typescript): %v\n%s%s", err, out, stderr.String())
	}
	tgz := filepath.Join(work, names[len(names)-1])
	dir := filepath.Join(work, "app")
	into := filepath.Join(dir, "node_modules", "hiloop")
	if err := os.MkdirAll(into, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xzf", tgz, "-C", into, "--strip-components=1").CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", tgz, err, out)
	}
	for _, name := range []string{"typescript", "@types"} {
		if err := os.Symlink(filepath.Join(mods, name), filepath.Join(dir, "node_modules", name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// nodeFlags are the flags node needs for the SDK: the global WebSocket is
// behind --experimental-websocket before Node 22.
func nodeFlags(t testing.TB) []string {
	t.Helper()
	out, err := exec.Command("node", "-p", "process.versions.node").Output()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	major, _ := strconv.Atoi(strings.SplitN(strings.TrimSpace(string(out)), ".", 2)[0])
	if major < 22 {
		return []string{"--experimental-websocket", "--no-warnings=ExperimentalWarning"}
	}
	return nil
}

// TestTypeScriptSDK packs the TypeScript SDK, checks what the package
// holds, and runs its node --test suites (sdk/typescript/test) with the
// packed SDK against a live hiloop serve on the local cluster, with
// previews on and a second organization's key for the isolation tests.
func TestTypeScriptSDK(t *testing.T) {
	dir := installTypeScript(t)
	for _, f := range []string{"dist/index.js", "dist/index.d.ts", "dist/exec.js", "package.json"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "hiloop", f)); err != nil {
			t.Errorf("the packed SDK lacks %s: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "hiloop", "src")); err == nil {
		t.Errorf("the packed SDK carries its sources")
	}
	tests, err := filepath.Glob(e2e.Path(t, "sdk/typescript/test/*.test.mjs"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests in sdk/typescript/test: %v", err)
	}
	run := t.TempDir()
	os.Symlink(filepath.Join(dir, "node_modules"), filepath.Join(run, "node_modules"))
	args := append(nodeFlags(t), "--test")
	for _, f := range tests {
		copyFile(t, f, filepath.Join(run, filepath.Base(f)))
		args = append(args, filepath.Base(f))
	}

	e2e.Helpers(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t),
		append(previewServeFlags(t), "--agent-image", "hiloop-agent:local")...)
	cmd := exec.Command("node", args...)
	cmd.Dir = run
	cmd.Env = append(os.Environ(), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+in.Token, "HILOOP_TEST_TOKEN_B="+in.NewOrg("ts-b", 5, 5))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "# SKIP") {
		t.Errorf("tests were skipped:\n%s", out)
	}
	t.Log(string(out))
}
