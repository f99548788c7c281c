package localcluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/hiloop/hiloop/k8s"
)

// HelperOptions configure RunHelpers.
type HelperOptions struct {
	Clients *k8s.Clients
	// Binary is the hiloop binary whose `agent` command runs each helper.
	Binary string
	// Dir holds each helper's key file and log, under helpers/<pod uid>/.
	Dir string
	Log *slog.Logger
}

// RunHelpers stands in for the kubelet of session helpers, since the local
// cluster's pods run no containers: for every hiloop pod that has the
// helper container and an address, it runs `hiloop agent` as a local
// process bound to the pod's loopback address and the helper's port,
// with the gateway-key annotation written to a file as the kubelet's
// downwardAPI volume would (and rewritten when the annotation changes) and
// the container's environment resolved from the pod as the kubelet's
// downward API would (the sandbox id, from its label). A helper that exits
// while its pod runs is started again after a backoff, as the kubelet
// restarts a container, and one whose pod shows another address is moved
// there. It stops the process when the pod goes. In the local cluster
// "loopback inside the pod" is the host's loopback. It runs until ctx
// ends.
func RunHelpers(ctx context.Context, o HelperOptions) error {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	r := &helperRunner{o: o, log: o.Log.With("component", "helper-runner"), procs: map[string]*helperProc{}}
	factory := informers.NewSharedInformerFactoryWithOptions(o.Clients.Kube, 30*time.Second,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = k8s.Selector }))
	inf := factory.Core().V1().Pods().Informer()
	r.pods = inf.GetStore()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.sync(obj) },
		UpdateFunc: func(_, obj any) { r.sync(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				r.stop(string(p.UID))
			}
		},
	})
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for uid := range r.procs {
		r.stopLocked(uid)
	}
	return nil
}

type helperRunner struct {
	o    HelperOptions
	log  *slog.Logger
	pods cache.Store
	mu   sync.Mutex
	// closed says RunHelpers is ending: no helper starts any more.
	closed bool
	procs  map[string]*helperProc
}

type helperProc struct {
	cmd *exec.Cmd
	dir string
	// pod is the pod's cache key (namespace/name), addr where the helper
	// listens.
	pod, addr, key string
	// restarts counts the starts of this pod's helper after one exited.
	restarts int
	done     chan struct{}
}

// restartBackoff is how long a helper that exited by itself waits to be
// started again after its n-th restart: doubling from 200ms up to 10s
// (the kubelet's own backoff starts at 10s, too slow for a development
// cluster's tests).
func restartBackoff(n int) time.Duration {
	return min(200*time.Millisecond<<min(n, 6), 10*time.Second)
}

// sync makes the helper process of one pod match the pod.
func (r *helperRunner) sync(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	uid := string(p.UID)
	port := helperPort(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || port == 0 || p.Status.PodIP == "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		r.stopLocked(uid)
		return
	}
	addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port))
	key := p.Annotations[k8s.AnnotationGatewayKey]
	restarts := 0
	if pr, ok := r.procs[uid]; ok && pr.exited() {
		// A helper that died is started again, as a kubelet restarts a
		// container; it comes back with a new host key.
		delete(r.procs, uid)
		restarts = pr.restarts + 1
	} else if ok && pr.addr != addr {
		// A pod's address does not change under a kubelet; should the
		// simulated one change, the helper follows it.
		r.log.Info("session helper moves to the pod's new address", "pod", p.Namespace+"/"+p.Name, "from", pr.addr, "to", addr)
		r.stopLocked(uid)
	}
	if pr, ok := r.procs[uid]; ok {
		if pr.key != key {
			if err := writeAtomic(filepath.Join(pr.dir, "gateway.pub"), key); err != nil {
				r.log.Error("write helper key", "pod", p.Name, "err", err)
			}
			pr.key = key
		}
		return
	}
	dir := filepath.Join(r.o.Dir, "helpers", uid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		r.log.Error("helper dir", "err", err)
		return
	}
	keyFile := filepath.Join(dir, "gateway.pub")
	if err := writeAtomic(keyFile, key); err != nil {
		r.log.Error("write helper key", "pod", p.Name, "err", err)
		return
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		r.log.Error("helper log", "err", err)
		return
	}
	defer logf.Close()
	env, err := helperEnv(p)
	if err != nil {
		// The kubelet would not start the container either.
		r.log.Error("helper environment", "pod", p.Name, "err", err)
		return
	}
	cmd := exec.Command(r.o.Binary, "agent", "--listen", addr, "--authorized-keys", keyFile)
	cmd.Stdout, cmd.Stderr = logf, logf
	// In a pod, the helper's CPU limit (500m) makes Go's runtime use one
	// processor; a local process is told so.
	cmd.Env = append(append(os.Environ(), "GOMAXPROCS=1"), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		r.log.Error("start helper", "pod", p.Name, "err", err)
		return
	}
	pr := &helperProc{cmd: cmd, dir: dir, pod: p.Namespace + "/" + p.Name, addr: addr, key: key, restarts: restarts, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(pr.done)
		time.AfterFunc(restartBackoff(pr.restarts), func() { r.restart(uid, pr) })
	}()
	r.procs[uid] = pr
	r.log.Info("session helper started", "pod", pr.pod, "addr", addr, "restarts", restarts)
}

// restart starts pr's pod's helper again once pr exited by itself: when
// the runner stopped it, or something else started the pod's helper since,
// pr is no longer the pod's and nothing happens.
func (r *helperRunner) restart(uid string, pr *helperProc) {
	r.mu.Lock()
	current := r.procs[uid] == pr && !r.closed
	r.mu.Unlock()
	if !current {
		return
	}
	if obj, ok, _ := r.pods.GetByKey(pr.pod); ok {
		if p, isPod := obj.(*corev1.Pod); isPod && p.UID == types.UID(uid) {
			r.sync(p)
		}
	}
}

func (p *helperProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (r *helperRunner) stop(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked(uid)
}

func (r *helperRunner) stopLocked(uid string) {
	pr, ok := r.procs[uid]
	if !ok {
		return
	}
	delete(r.procs, uid)
	pr.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pr.done:
	case <-time.After(5 * time.Second):
		pr.cmd.Process.Kill()
		<-pr.done
	}
	os.RemoveAll(pr.dir)
}

// helperEnv is the helper container's environment as the kubelet would
// resolve it from the pod: literal values, and downward API fields of the
// pod's metadata (the sandbox id comes from its label this way).
func helperEnv(p *corev1.Pod) ([]string, error) {
	var env []string
	for _, c := range p.Spec.Containers {
		if c.Name != k8s.HelperContainer {
			continue
		}
		for _, e := range c.Env {
			v := e.Value
			if e.ValueFrom != nil {
				if e.ValueFrom.FieldRef == nil {
					return nil, fmt.Errorf("env %s: only fieldRef sources are resolved here", e.Name)
				}
				var ok bool
				if v, ok = podField(p, e.ValueFrom.FieldRef.FieldPath); !ok {
					return nil, fmt.Errorf("env %s: field %q is not resolved here", e.Name, e.ValueFrom.FieldRef.FieldPath)
				}
			}
			env = append(env, e.Name+"="+v)
		}
	}
	return env, nil
}

// podField is a downward API field of the pod's metadata, reporting whether
// it is one this runner resolves.
func podField(p *corev1.Pod, path string) (string, bool) {
	for prefix, m := range map[string]map[string]string{"metadata.labels": p.Labels, "metadata.annotations": p.Annotations} {
		if key, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok = strings.CutSuffix(key, "']"); ok {
				return m[key], true
			}
		}
	}
	switch path {
	case "metadata.name":
		return p.Name, true
	case "metadata.namespace":
		return p.Namespace, true
	case "metadata.uid":
		return string(p.UID), true
	}
	return "", false
}

// helperPort is the session helper's port in the pod, 0 when it has none.
func helperPort(p *corev1.Pod) int {
	for _, c := range p.Spec.Containers {
		if c.Name == k8s.HelperContainer && len(c.Ports) > 0 {
			return int(c.Ports[0].ContainerPort)
		}
	}
	return 0
}

// writeAtomic replaces a file in one rename, as the kubelet swaps a
// projected volume's contents.
func writeAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}
