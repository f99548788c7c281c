package server

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/sandbox"
	"github.com/hiloop/hiloop/store"
)

// Limits on what a request may ask for. They refuse the absurd, not the
// large: a cluster's own quotas and limit ranges still apply.
const (
	MinTTL        = 5 * time.Second
	MaxTTL        = 30 * 24 * time.Hour
	MaxVolumes    = 8
	MaxLabels     = 32
	MaxImageLen   = 512
	maxCPU        = "256"
	maxMemory     = "2Ti"
	maxVolumeSize = "64Ti"
	// The smallest CPU, memory and volume a sandbox may ask for: below them
	// no image starts (gVisor alone needs tens of MiB), so a smaller value
	// is a typo, not a choice.
	minCPU        = "10m"
	minMemory     = "16Mi"
	minVolumeSize = "1Mi"
	MaxTransports = 8
	// reservedVolumePrefix starts the names of the pod volumes hiloop
	// renders itself; a sandbox's own volumes may not use it.
	reservedVolumePrefix = "hiloop-"
)

// The patterns are compiled on first use, not when the package is
// initialized: the CLI is the same binary and initializes this package too
// before every command, and their counted repetitions ({0,251}) compile to
// large programs: half a megabyte and 3,300 allocations before main, a
// twentieth of the CPU of `hiloop sandbox exec ID -- true`.
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

// validateCreate checks every field of a create request and returns the
// spec to record, or an error naming the field. Whether the deployment
// backs what the spec asks for is control's admission.
func validateCreate(req api.CreateSandboxRequest) (store.Spec, error) {
	spec := store.Spec{Image: req.Image, ShutdownPolicy: "retain", Labels: req.Labels}
	switch {
	case req.Image == "":
		return spec, fieldError("image", "is required")
	case len(req.Image) > MaxImageLen || !imageRef().MatchString(req.Image):
		return spec, fieldError("image", fmt.Sprintf("%q is not a valid image reference", truncate(req.Image)))
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
		ttl, err := parseTTL("ttl", req.TTL)
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
		return spec, fieldError("shutdown_policy", fmt.Sprintf("%q is not retain or delete", truncate(req.ShutdownPolicy)))
	}
	if len(req.Volumes) > MaxVolumes {
		return spec, fieldError("volumes", fmt.Sprintf("at most %d volumes", MaxVolumes))
	}
	names, mounts := map[string]bool{}, map[string]bool{}
	for i, v := range req.Volumes {
		f := fmt.Sprintf("volumes[%d]", i)
		if !dnsLabel().MatchString(v.Name) {
			return spec, fieldError(f+".name", fmt.Sprintf("%q must be a lower-case DNS label of at most 40 characters", truncate(v.Name)))
		}
		if strings.HasPrefix(v.Name, reservedVolumePrefix) {
			// The controller would put the claim in place of hiloop's own pod
			// volume of the same name (the session helper's key).
			return spec, fieldError(f+".name", fmt.Sprintf("%q: names starting with %q are hiloop's", truncate(v.Name), reservedVolumePrefix))
		}
		if names[v.Name] {
			return spec, fieldError(f+".name", fmt.Sprintf("duplicate volume name %q", v.Name))
		}
		names[v.Name] = true
		if err := validateQuantity(f+".size", v.Size, minVolumeSize, maxVolumeSize, true); err != nil {
			return spec, err
		}
		if !path.IsAbs(v.MountPath) || path.Clean(v.MountPath) != v.MountPath || v.MountPath == "/" || strings.ContainsAny(v.MountPath, "\x00:") {
			return spec, fieldError(f+".mount_path", fmt.Sprintf("%q must be a clean absolute path other than /", truncate(v.MountPath)))
		}
		if mounts[v.MountPath] {
			return spec, fieldError(f+".mount_path", fmt.Sprintf("duplicate mount path %q", v.MountPath))
		}
		mounts[v.MountPath] = true
		if v.StorageClass != "" {
			if !dnsLabel().MatchString(v.StorageClass) && !labelKey().MatchString(v.StorageClass) {
				return spec, fieldError(f+".storage_class", fmt.Sprintf("%q is not a storage class name", truncate(v.StorageClass)))
			}
		}
		spec.Volumes = append(spec.Volumes, store.Volume{Name: v.Name, Size: v.Size, MountPath: v.MountPath, StorageClass: v.StorageClass})
	}
	if len(req.Transports) > MaxTransports {
		return spec, fieldError("transports", fmt.Sprintf("at most %d transports", MaxTransports))
	}
	for i, t := range req.Transports {
		if !transportName().MatchString(t) {
			return spec, fieldError(fmt.Sprintf("transports[%d]", i), fmt.Sprintf("%q is not a transport name", truncate(t)))
		}
		if !slices.Contains(spec.Transports, sandbox.Transport(t)) {
			spec.Transports = append(spec.Transports, sandbox.Transport(t))
		}
	}
	if err := validateLabels("labels", req.Labels); err != nil {
		return spec, err
	}
	return spec, nil
}

// MinIdleTimeout is the shortest idle timeout a sandbox may have other
// than 0 (off); MaxTTL is the longest.
const MinIdleTimeout = time.Second

// parseIdleTimeout reads an idle timeout: "0" turns idle stop off.
func parseIdleTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, fieldError("idle_timeout", fmt.Sprintf("%q is not a duration such as 30m, or 0 for never", truncate(s)))
	case d != 0 && (d < MinIdleTimeout || d > MaxTTL):
		return 0, fieldError("idle_timeout", fmt.Sprintf("%s is outside %s to %s (0 turns it off)", d, MinIdleTimeout, MaxTTL))
	}
	return d.Truncate(time.Second), nil
}

func parseTTL(field, s string) (time.Duration, error) {
	ttl, err := time.ParseDuration(s)
	if err != nil {
		return 0, fieldError(field, fmt.Sprintf("%q is not a duration such as 90m or 24h", truncate(s)))
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return 0, fieldError(field, fmt.Sprintf("%s is outside %s to %s", ttl, MinTTL, MaxTTL))
	}
	return ttl, nil
}

func validateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fieldError(field, fmt.Sprintf("at most %d labels", MaxLabels))
	}
	for k, v := range labels {
		if !labelKey().MatchString(k) {
			return fieldError(field, fmt.Sprintf("key %q is not a valid label key", truncate(k)))
		}
		if !labelValue().MatchString(v) {
			return fieldError(field+"."+k, fmt.Sprintf("value %q is not a valid label value", truncate(v)))
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
	rq, lq := resource.MustParse(request), resource.MustParse(limit)
	if rq.Cmp(lq) > 0 {
		return fieldError(field+"_request", fmt.Sprintf("%s exceeds the limit %s", request, limit))
	}
	return nil
}

func validateQuantity(field, v, min, max string, required bool) error {
	if v == "" {
		if required {
			return fieldError(field, "is required")
		}
		return nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return fieldError(field, fmt.Sprintf("%q is not a quantity such as 500m, 2 or 1Gi", truncate(v)))
	}
	if q.Sign() <= 0 {
		return fieldError(field, fmt.Sprintf("%s must be positive", v))
	}
	if m := resource.MustParse(min); q.Cmp(m) < 0 {
		return fieldError(field, fmt.Sprintf("%s is below the minimum %s", v, min))
	}
	if m := resource.MustParse(max); q.Cmp(m) > 0 {
		return fieldError(field, fmt.Sprintf("%s exceeds the maximum %s", v, max))
	}
	return nil
}

// truncate keeps echoed input short.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
