package control

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/hiloop/hiloop/api"
)

// Limits on the environment a sandbox is created with, and on the
// environment and working directory a command runs with. Every way in
// (create, exec, run, and whatever runs commands later) checks them with
// ValidateEnv and ValidateCwd.
const (
	// MaxEnvVars caps the number of variables.
	MaxEnvVars = 64
	// MaxEnvBytes caps their total size, each counted as NAME=VALUE and a
	// terminating NUL, as the kernel counts an environment.
	MaxEnvBytes = 32 << 10
	// ReservedEnvPrefix starts the names hiloop keeps for itself (in any
	// case): the session helper's variables, and those of the script that
	// sets a command's environment up.
	ReservedEnvPrefix = "HILOOP_"
)

// ErrInvalidEnv and ErrInvalidPath are ErrInvalid for an environment and a
// path (a file's, or a command's working directory). They come as a
// *FieldError that names the field.
var (
	ErrInvalidEnv  = fmt.Errorf("%w: environment", ErrInvalid)
	ErrInvalidPath = fmt.Errorf("%w: path", ErrInvalid)
)

// envName is a portable environment variable name: what POSIX sh can
// export, and what Kubernetes takes in a container's env.
var envName = lazyRegexp(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateEnv reports whether env is an environment a sandbox or a command
// may be given: at most MaxEnvVars names, each a portable name (letters,
// digits and _, not starting with a digit) not starting with
// ReservedEnvPrefix in any case, values of UTF-8 without NUL bytes (the
// kubelet's runtime API carries a command's arguments, which the set-up
// makes of the values, as protobuf strings, which must be UTF-8), and at most
// MaxEnvBytes in all. It returns a *FieldError (ErrInvalidEnv) naming
// field, or field.NAME for a bad value. Names are checked in order, so the
// same bad environment always gets the same answer.
func ValidateEnv(field string, env map[string]string) error {
	bad := func(f, msg string) error { return &FieldError{Field: f, Message: msg, Err: ErrInvalidEnv} }
	if len(env) > MaxEnvVars {
		return bad(field, fmt.Sprintf("at most %d variables", MaxEnvVars))
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		switch {
		case !envName().MatchString(k):
			return bad(field, fmt.Sprintf("%q is not a variable name (letters, digits and _, not starting with a digit)", Truncate(k)))
		case strings.HasPrefix(strings.ToUpper(k), ReservedEnvPrefix):
			return bad(field, fmt.Sprintf("%q: names starting with %s are hiloop's", Truncate(k), ReservedEnvPrefix))
		case strings.IndexByte(v, 0) >= 0:
			return bad(field+"."+k, "a value cannot contain NUL bytes")
		case !utf8.ValidString(v):
			return bad(field+"."+k, "a value must be UTF-8 (the cluster carries a command's environment as text)")
		}
		total += len(k) + len(v) + 2
	}
	if total > MaxEnvBytes {
		return bad(field, fmt.Sprintf("exceeds %d bytes (each variable counted as NAME=VALUE and one byte)", MaxEnvBytes))
	}
	return nil
}

// ValidatePath reports whether p is a path in a sandbox a caller may name:
// absolute and clean, at most api.MaxPathBytes, UTF-8, with no NUL or
// other control character. Paths reach the sandbox only as arguments, which
// the kubelet's runtime API carries only as UTF-8; a control character in
// one is never what a caller meant, and would garble logs and listings. It
// returns a *FieldError (ErrInvalidPath) naming field.
func ValidatePath(field, p string) error {
	bad := func(msg string) error { return &FieldError{Field: field, Message: msg, Err: ErrInvalidPath} }
	switch {
	case p == "":
		return bad("is required")
	case len(p) > api.MaxPathBytes:
		return bad(fmt.Sprintf("longer than %d bytes", api.MaxPathBytes))
	case !strings.HasPrefix(p, "/"):
		return bad("must be absolute")
	case !utf8.ValidString(p):
		return bad("must be UTF-8")
	case strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return bad("must not contain NUL or other control characters")
	case path.Clean(p) != p:
		return bad(fmt.Sprintf("must be clean (no '.', '..', '//' or trailing '/'): %q", Truncate(path.Clean(p))))
	}
	return nil
}

// ValidateCwd reports whether dir is a working directory a command may be
// given: "" (the container's own) or a path ValidatePath takes, checked as
// field.
func ValidateCwd(field, dir string) error {
	if dir == "" {
		return nil
	}
	return ValidatePath(field, dir)
}

// ValidateExecSetup checks the environment and working directory of a
// command, as the fields env and cwd.
func ValidateExecSetup(env map[string]string, cwd string) error {
	if err := ValidateEnv("env", env); err != nil {
		return err
	}
	return ValidateCwd("cwd", cwd)
}
