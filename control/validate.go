package control

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// ErrInvalid: a request field is malformed or outside its limits. It comes
// as a *FieldError that names the field.
var ErrInvalid = errors.New("invalid request")

// invalid is the error of a bad field; its message starts with the field.
func invalid(field, msg string) error {
	return &FieldError{Field: field, Message: msg, Err: ErrInvalid}
}

// Limits on what a request may ask for. They refuse the absurd, not the
// large: a cluster's own quotas and limit ranges still apply.
const (
	MinTTL = 5 * time.Second
	MaxTTL = 30 * 24 * time.Hour
	// MinIdleTimeout is the shortest idle timeout a sandbox or an
	// organization may have other than 0 (off); MaxTTL is the longest.
	MinIdleTimeout    = time.Second
	MaxVolumes        = 8
	MaxLabels         = 32
	MaxImageLen       = 512
	MaxTransports     = 8
	MaxIdempotencyKey = 255
	maxCPU            = "256"
	maxMemory         = "2Ti"
	maxVolumeSize     = "64Ti"
	// The smallest CPU, memory and volume a sandbox may ask for: below them
	// no image starts (gVisor alone needs tens of MiB), so a smaller value
	// is a typo, not a choice.
	minCPU        = "10m"
	minMemory     = "16Mi"
	minVolumeSize = "1Mi"
)

// The patterns are compiled on first use, not when the package is
// initialized: the CLI is the same binary and initializes this package too
// before every command, and their counted repetitions ({0,251}) compile to
// large programs, which every command would pay for before main
// (docs/benchmarks.md, exec round trip).
var (
	// imageRef follows the distribution reference grammar: optional
	// registry host (with port), lower-case path components, optional tag,
	// optional digest.
	imageRef = lazyRegexp(`^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?` +
		`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*` +
		`(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@(?:sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}))?$`)
	transportName = lazyRegexp(`^[a-z][a-z0-9-]{0,31}$`)
	dnsLabel      = lazyRegexp(`^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$`)
	labelKey      = lazyRegexp(`^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
	labelValue    = lazyRegexp(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)
)

// lazyRegexp compiles pattern on its first use.
func lazyRegexp(pattern string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
}

// NewCreateRequest checks every field of a create request and its
// idempotency key, and makes the create that Create takes, or returns an
// ErrInvalid error naming the field. Whether the deployment backs what the
// spec asks for is Create's admission.
func NewCreateRequest(req api.CreateSandboxRequest, idempotencyKey string) (CreateRequest, error) {
	if len(idempotencyKey) > MaxIdempotencyKey {
		return CreateRequest{}, invalid("Idempotency-Key", fmt.Sprintf("at most %d characters", MaxIdempotencyKey))
	}
	spec, err := validateSpec(req)
	if err != nil {
		return CreateRequest{}, err
	}
	cr := CreateRequest{Spec: spec, IdempotencyKey: idempotencyKey, RequestHash: canonicalHash(req)}
	if req.IdleTimeout != "" {
		d, err := parseIdleTimeout(req.IdleTimeout)
		if err != nil {
			return CreateRequest{}, err
		}
		cr.IdleTimeout = &d
	}
	return cr, nil
}

// canonicalHash identifies a create request by its meaning, not its bytes:
// the same request with its keys reordered or other whitespace is the same
// request (encoding/json marshals struct fields in order and map keys
// sorted).
func canonicalHash(req api.CreateSandboxRequest) string {
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// validateSpec checks every field of a create request but its idle timeout
// and returns the spec to record.
func validateSpec(req api.CreateSandboxRequest) (store.Spec, error) {
	spec := store.Spec{Image: req.Image, ShutdownPolicy: "retain", Labels: req.Labels}
	switch {
	case req.Image == "":
		return spec, invalid("image", "is required")
	case len(req.Image) > MaxImageLen || !imageRef().MatchString(req.Image):
		return spec, invalid("image", fmt.Sprintf("%q is not a valid image reference", Truncate(req.Image)))
	}
	if r := req.Resources; r != nil {
		spec.CPURequest, spec.CPULimit, spec.MemoryRequest, spec.MemoryLimit = r.CPURequest, r.CPULimit, r.MemoryRequest, r.MemoryLimit
		if err := validatePair("resources.cpu", r.CPURequest, r.CPULimit, minCPU, maxCPU); err != nil {
			return spec, err
		}
		if err := validatePair("resources.memory", r.MemoryRequest, r.MemoryLimit, minMemory, maxMemory); err != nil {
			return spec, err
		}
	}
	if req.TTL != "" {
		ttl, err := parseTTL(req.TTL)
		if err != nil {
			return spec, err
		}
		spec.TTLSeconds = int64(ttl / time.Second)
	}
	switch req.ShutdownPolicy {
	case "", "retain":
	case "delete":
		spec.ShutdownPolicy = "delete"
	default:
		return spec, invalid("shutdown_policy", fmt.Sprintf("%q is not retain or delete", Truncate(req.ShutdownPolicy)))
	}
	var err error
	if spec.Volumes, err = validateVolumes(req.Volumes); err != nil {
		return spec, err
	}
	if spec.Transports, err = validateTransports(req.Transports); err != nil {
		return spec, err
	}
	if err := ValidateLabels("labels", req.Labels); err != nil {
		return spec, err
	}
	if err := ValidateEnv("env", req.Env); err != nil {
		return spec, err
	}
	if len(req.Env) > 0 {
		spec.Env = req.Env
	}
	return spec, nil
}

// validateVolumes checks each volume's name, size, mount path and storage
// class, and that no two share a name or a mount path.
func validateVolumes(vols []api.VolumeRequest) ([]store.Volume, error) {
	if len(vols) > MaxVolumes {
		return nil, invalid("volumes", fmt.Sprintf("at most %d volumes", MaxVolumes))
	}
	var out []store.Volume
	names, mounts := map[string]bool{}, map[string]bool{}
	for i, v := range vols {
		f := fmt.Sprintf("volumes[%d]", i)
		if !dnsLabel().MatchString(v.Name) {
			return nil, invalid(f+".name", fmt.Sprintf("%q must be a lower-case DNS label of at most 40 characters", Truncate(v.Name)))
		}
		if strings.HasPrefix(v.Name, cluster.ReservedVolumePrefix) {
			return nil, invalid(f+".name", fmt.Sprintf("%q: names starting with %q are hiloop's", Truncate(v.Name), cluster.ReservedVolumePrefix))
		}
		if names[v.Name] {
			return nil, invalid(f+".name", fmt.Sprintf("duplicate volume name %q", v.Name))
		}
		names[v.Name] = true
		if err := validateQuantity(f+".size", v.Size, minVolumeSize, maxVolumeSize, true); err != nil {
			return nil, err
		}
		if !path.IsAbs(v.MountPath) || path.Clean(v.MountPath) != v.MountPath || v.MountPath == "/" || strings.ContainsAny(v.MountPath, "\x00:") {
			return nil, invalid(f+".mount_path", fmt.Sprintf("%q must be a clean absolute path other than /", Truncate(v.MountPath)))
		}
		if mounts[v.MountPath] {
			return nil, invalid(f+".mount_path", fmt.Sprintf("duplicate mount path %q", v.MountPath))
		}
		mounts[v.MountPath] = true
		if v.StorageClass != "" {
			if !dnsLabel().MatchString(v.StorageClass) && !labelKey().MatchString(v.StorageClass) {
				return nil, invalid(f+".storage_class", fmt.Sprintf("%q is not a storage class name", Truncate(v.StorageClass)))
			}
		}
		out = append(out, store.Volume{Name: v.Name, Size: v.Size, MountPath: v.MountPath, StorageClass: v.StorageClass})
	}
	return out, nil
}

// validateTransports checks each transport's name and drops repeats,
// keeping the order they were asked for in.
func validateTransports(names []string) ([]receipt.Transport, error) {
	if len(names) > MaxTransports {
		return nil, invalid("transports", fmt.Sprintf("at most %d transports", MaxTransports))
	}
	var out []receipt.Transport
	for i, t := range names {
		if !transportName().MatchString(t) {
			return nil, invalid(fmt.Sprintf("transports[%d]", i), fmt.Sprintf("%q is not a transport name", Truncate(t)))
		}
		if !slices.Contains(out, receipt.Transport(t)) {
			out = append(out, receipt.Transport(t))
		}
	}
	return out, nil
}

// NewUpdate checks a PATCH of a sandbox and makes the update that Update
// takes: it sets at least one field, and every field it sets is within its
// limits.
func NewUpdate(req api.UpdateSandboxRequest) (Update, error) {
	var u Update
	if req.TTL == "" && req.IdleTimeout == "" {
		return u, invalid("ttl", "ttl or idle_timeout is required")
	}
	if req.TTL != "" {
		ttl, err := parseTTL(req.TTL)
		if err != nil {
			return u, err
		}
		u.TTL = &ttl
	}
	if req.IdleTimeout != "" {
		idle, err := parseIdleTimeout(req.IdleTimeout)
		if err != nil {
			return u, err
		}
		u.IdleTimeout = &idle
	}
	return u, nil
}

// check holds an update to the limits, every field before any is set.
func (u Update) check() error {
	if u.TTL == nil && u.IdleTimeout == nil {
		return invalid("ttl", "ttl or idle_timeout is required")
	}
	if u.TTL != nil {
		if err := checkTTL(*u.TTL); err != nil {
			return err
		}
	}
	if u.IdleTimeout != nil {
		if err := CheckIdleTimeout(*u.IdleTimeout); err != nil {
			return invalid("idle_timeout", err.Error())
		}
	}
	return nil
}

// CheckIdleTimeout reports whether d is an idle timeout a sandbox or an
// organization may have: 0 (off), or from MinIdleTimeout to MaxTTL.
func CheckIdleTimeout(d time.Duration) error {
	if d != 0 && (d < MinIdleTimeout || d > MaxTTL) {
		return fmt.Errorf("%s is outside %s to %s (0 turns it off)", d, MinIdleTimeout, MaxTTL)
	}
	return nil
}

// parseIdleTimeout reads an idle timeout: "0" turns idle stop off.
func parseIdleTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid("idle_timeout", fmt.Sprintf("%q is not a duration such as 30m, or 0 for never", Truncate(s)))
	}
	if err := CheckIdleTimeout(d); err != nil {
		return 0, invalid("idle_timeout", err.Error())
	}
	return d.Truncate(time.Second), nil
}

func parseTTL(s string) (time.Duration, error) {
	ttl, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid("ttl", fmt.Sprintf("%q is not a duration such as 90m or 24h", Truncate(s)))
	}
	return ttl, checkTTL(ttl)
}

func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return invalid("ttl", fmt.Sprintf("%s is outside %s to %s", ttl, MinTTL, MaxTTL))
	}
	return nil
}

// ValidateLabels checks a set of labels (a sandbox's, or a list filter)
// named field.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return invalid(field, fmt.Sprintf("at most %d labels", MaxLabels))
	}
	for k, v := range labels {
		if !labelKey().MatchString(k) {
			return invalid(field, fmt.Sprintf("key %q is not a valid label key", Truncate(k)))
		}
		if !labelValue().MatchString(v) {
			return invalid(field+"."+k, fmt.Sprintf("value %q is not a valid label value", Truncate(v)))
		}
	}
	return nil
}

// validatePair checks a request and a limit, and that the request does not
// exceed the limit.
func validatePair(field, request, limit, min, max string) error {
	if err := validateQuantity(field+"_request", request, min, max, false); err != nil {
		return err
	}
	if err := validateQuantity(field+"_limit", limit, min, max, false); err != nil {
		return err
	}
	if request == "" || limit == "" {
		return nil
	}
	rq, lq := mustQuantity(request), mustQuantity(limit)
	if rq.Cmp(lq) > 0 {
		return invalid(field+"_request", fmt.Sprintf("%s exceeds the limit %s", request, limit))
	}
	return nil
}

func validateQuantity(field, v, min, max string, required bool) error {
	if v == "" {
		if required {
			return invalid(field, "is required")
		}
		return nil
	}
	q, err := parseQuantity(v)
	if err != nil {
		return invalid(field, fmt.Sprintf("%q is not a quantity such as 500m, 2 or 1Gi", Truncate(v)))
	}
	if q.Sign() <= 0 {
		return invalid(field, fmt.Sprintf("%s must be positive", v))
	}
	if m := mustQuantity(min); q.Cmp(m) < 0 {
		return invalid(field, fmt.Sprintf("%s is below the minimum %s", v, min))
	}
	if m := mustQuantity(max); q.Cmp(m) > 0 {
		return invalid(field, fmt.Sprintf("%s exceeds the maximum %s", v, max))
	}
	return nil
}

// Truncate keeps input echoed in a message short.
func Truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
