// Package k8s is hiloop's access to the cluster: client construction, the
// checks that the cluster answers and serves the Sandbox API, rendering a
// sandbox into an agents.x-k8s.io/v1beta1 Sandbox, the small write
// vocabulary (create, patch mode and expiry, annotate, delete) and exec.
// The isolation self-check, which reads the boundary's objects through
// these clients, is package boundary.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	sandboxclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
)

// Group, version and resource of the upstream Sandbox API.
const (
	SandboxGroup    = "agents.x-k8s.io"
	SandboxVersion  = "v1beta1"
	SandboxResource = "sandboxes"
)

// Clients are the typed clients hiloop uses.
type Clients struct {
	Config  *rest.Config
	Kube    kubernetes.Interface
	Sandbox sandboxclient.Interface
}

// LoadConfig finds the cluster: an explicit kubeconfig path, else the
// in-cluster service account, else client-go's default loading rules
// ($KUBECONFIG, ~/.kube/config).
func LoadConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		if _, err := os.Stat(kubeconfig); err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return nil, errors.New("no cluster configured: pass --kubeconfig, set KUBECONFIG, or run in a cluster")
		}
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// NewClients builds the clients for cfg. It makes no request.
func NewClients(cfg *rest.Config) (*Clients, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		// hiloop's writes are few and small but come in bursts of creates;
		// client-go's default of 5 QPS would be the bottleneck.
		cfg.QPS, cfg.Burst = 200, 400
	}
	// Built-in kinds travel as protobuf, as the cluster's own components
	// send them: decoding the pod watch is the mirror's largest cost after
	// the record, and protobuf decodes several times faster than JSON.
	// Sandboxes, a custom resource, stay JSON.
	kubeCfg := rest.CopyConfig(cfg)
	kubeCfg.ContentType = "application/vnd.kubernetes.protobuf"
	kubeCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	kube, err := kubernetes.NewForConfig(kubeCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	sb, err := sandboxclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox client: %w", err)
	}
	return &Clients{Config: cfg, Kube: kube, Sandbox: sb}, nil
}

// ErrNotReady reports that the cluster is reachable but lacks what hiloop
// needs (the Sandbox API at v1beta1, or the isolation objects).
var ErrNotReady = errors.New("cluster not ready")

// CheckReachable makes one request to the API server, bounded by timeout, and
// returns one readable error when it fails.
func (c *Clients) CheckReachable(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := c.Kube.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
	if err == nil {
		return nil
	}
	host := c.Config.Host
	if u, perr := url.Parse(host); perr == nil && u.Host != "" {
		host = u.Host
	}
	if ctx.Err() != nil {
		return fmt.Errorf("cluster at %s: no answer within %s", host, timeout)
	}
	return fmt.Errorf("cluster at %s: unreachable: %s", host, ShortError(err))
}

// CheckSandboxAPI reports whether the API server serves the sandboxes
// resource at agents.x-k8s.io/v1beta1. The discovery client takes no
// context, so ctx's deadline becomes the request's own timeout: a hung API
// server costs at most that long.
func (c *Clients) CheckSandboxAPI(ctx context.Context) error {
	disco := c.Kube.Discovery()
	if dl, ok := ctx.Deadline(); ok {
		cfg := rest.CopyConfig(c.Config)
		cfg.Timeout = max(time.Until(dl), time.Millisecond)
		d, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return err
		}
		disco = d
	}
	list, err := disco.ServerResourcesForGroupVersion(SandboxGroup + "/" + SandboxVersion)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s/%s is not served (is the agent-sandbox CRD installed?)", ErrNotReady, SandboxGroup, SandboxVersion)
	}
	if err != nil {
		return fmt.Errorf("discover %s/%s: %s", SandboxGroup, SandboxVersion, ShortError(err))
	}
	if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == SandboxResource }) {
		return fmt.Errorf("%w: %s is not served at %s/%s", ErrNotReady, SandboxResource, SandboxGroup, SandboxVersion)
	}
	return nil
}

// ShortError is an API server error without the request client-go puts
// before it ("Get \"https://...\": dial tcp ..."), as a check reports it.
func ShortError(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, "\": "); i >= 0 {
		msg = msg[i+3:]
	}
	return msg
}
