// Package kube watches the pods of one Kubernetes node and tells the node
// agent the lane each asks for with its annotations (rxlane.io/lane,
// rxlane.io/ports, rxlane.io/proto). It is the path for CNIs that do not
// hand a pod's annotations to chained plugins: the agent learns the lane
// from the API server instead of from rxlane-cni.
//
// The watch asks the API server only for the node's pods (field selector
// spec.nodeName=NODE). A pod is a workload{Source: kubernetes, ID: its
// UID} with the addresses of status.podIPs; host-network pods are never
// workloads (their addresses are the node's). An annotation can only ask
// for a lane: what a lane may skip is the agent's configuration alone.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rxlane/rxlane/internal/workload"
)

// AnnotationPrefix is the prefix of rxlane's pod annotations. Any other
// annotation with it (e.g. one asking to skip netfilter) is ignored with
// a warning: a pod can only ask for a lane.
const AnnotationPrefix = "rxlane.io/"

// DefaultResync is how often the watcher compares the agent's kubernetes
// workloads with the pods the API server still has (and the informer
// replays its cache).
const DefaultResync = 5 * time.Minute

// Sink is what the watcher tells: the node agent ((*agent.Agent) has
// these methods).
type Sink interface {
	SetWorkload(w workload.Workload) error
	RemoveWorkload(source, id string) error
	WorkloadsOf(source string) []workload.Workload
}

// Options configure a Watcher.
type Options struct {
	// Node is the node whose pods are watched (required).
	Node string
	// Client talks to the API server (Client(kubeconfig) makes one).
	Client kubernetes.Interface
	// Sink receives the workloads.
	Sink Sink
	// Resync is the period of the full comparison (DefaultResync if 0).
	Resync time.Duration
	Log    *slog.Logger
}

// Watcher follows the node's pods.
type Watcher struct {
	opts Options
	log  *slog.Logger
	// mu serialises the sink calls of the event handlers and resyncs,
	// and guards warned.
	mu sync.Mutex
	// warned: the last refusal logged for a pod UID (logged once per
	// change, not at every resync).
	warned map[string]string
}

// New checks the options.
func New(opts Options) (*Watcher, error) {
	if opts.Node == "" {
		return nil, errors.New("kubernetes: no node name (set kubernetes.node_name or $NODE_NAME)")
	}
	if opts.Client == nil || opts.Sink == nil {
		return nil, errors.New("kubernetes: watcher needs a client and a sink")
	}
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{opts: opts, log: opts.Log.With("watcher", "kubernetes", "node", opts.Node), warned: map[string]string{}}, nil
}

// Client makes an API client from a kubeconfig file, or ("") from the
// pod's service account (in-cluster: $KUBERNETES_SERVICE_HOST and the
// mounted token).
func Client(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: not in a cluster (%v): give kubernetes.kubeconfig", err)
		}
	} else {
		if _, err := os.Stat(kubeconfig); err != nil {
			return nil, fmt.Errorf("kubernetes: kubeconfig: %w", err)
		}
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.UserAgent = "rxlane-agent"
	return kubernetes.NewForConfig(cfg)
}

// FieldSelector is the watch's selector: the node's pods only.
func FieldSelector(node string) string {
	return fields.OneTermEqualSelector("spec.nodeName", node).String()
}

// Run watches until ctx ends. It returns once the informer has stopped.
func (w *Watcher) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(w.opts.Client, w.opts.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = FieldSelector(w.opts.Node) }))
	inf := factory.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.update(obj) },
		UpdateFunc: func(_, obj any) { w.update(obj) },
		DeleteFunc: func(obj any) { w.remove(obj) },
	})
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	w.log.Info("watching pods", "selector", FieldSelector(w.opts.Node))
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	// Pods deleted while the agent was down: their workloads (kept across
	// the agent's restarts) have no delete event to remove them.
	w.Resync(inf.GetStore())
	tick := time.NewTicker(w.opts.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			w.Resync(inf.GetStore())
		}
	}
}

// Resync removes the kubernetes workloads of pods the store no longer
// holds (or that no longer ask for a lane).
func (w *Watcher) Resync(store cache.Store) {
	w.mu.Lock()
	defer w.mu.Unlock()
	live := map[string]bool{}
	for _, obj := range store.List() {
		if p, ok := obj.(*corev1.Pod); ok && w.wanted(p) {
			live[string(p.UID)] = true
		}
	}
	for _, wl := range w.opts.Sink.WorkloadsOf(workload.SourceKubernetes) {
		if !live[wl.ID] {
			if err := w.opts.Sink.RemoveWorkload(wl.Source, wl.ID); err != nil {
				w.log.Error("resync: workload not removed", "workload", wl.String(), "error", err.Error())
				continue
			}
			w.log.Info("resync: pod gone, workload removed", "workload", wl.String())
		}
	}
}

// wanted: the pod is one of the node's, runs (or will), is not on the
// host network and has a lane annotation.
func (w *Watcher) wanted(p *corev1.Pod) bool {
	if p.Spec.NodeName != w.opts.Node || p.Spec.HostNetwork {
		return false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil {
		// Its addresses are being freed and may go to a new pod.
		return false
	}
	return asksLane(p.Annotations)
}

func asksLane(ann map[string]string) bool {
	for _, k := range []string{workload.AnnotationLane, workload.AnnotationPorts, workload.AnnotationProto} {
		if _, ok := ann[k]; ok {
			return true
		}
	}
	return false
}

// FromPod maps a pod to its workload. ok is false for a pod that is not
// a workload: on the host network, or finished.
func FromPod(p *corev1.Pod) (w workload.Workload, ok bool) {
	if p.Spec.HostNetwork {
		return w, false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return w, false
	}
	w = workload.Workload{Source: workload.SourceKubernetes, ID: string(p.UID), Name: p.Namespace + "/" + p.Name}
	w.Lane, w.Ports, w.Proto = workload.FromMetadata(p.Annotations, workload.AnnotationLane, workload.AnnotationPorts, workload.AnnotationProto)
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			w.IPs = append(w.IPs, a.Unmap())
		}
	}
	slices.SortFunc(w.IPs, func(a, b netip.Addr) int { return a.Compare(b) })
	w.IPs = slices.Compact(w.IPs)
	return w, true
}

// ignored lists the pod's rxlane.io/ annotations that are not a lane
// request (sorted).
func ignored(ann map[string]string) []string {
	var out []string
	for k := range ann {
		if strings.HasPrefix(k, AnnotationPrefix) && k != workload.AnnotationLane && k != workload.AnnotationPorts && k != workload.AnnotationProto {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func (w *Watcher) update(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	id := string(p.UID)
	if !w.wanted(p) {
		// Not (or no longer) asking: an annotation removed, the pod
		// finished or terminating. Idempotent in the agent.
		w.drop(id, p.Namespace+"/"+p.Name)
		return
	}
	wl, _ := FromPod(p)
	if ig := ignored(p.Annotations); len(ig) > 0 {
		w.warnOnce(id, "ignored:"+strings.Join(ig, ","), "pod annotations ignored: a pod can only ask for a lane (what a lane may skip is the agent's configuration)",
			"pod", wl.Name, "annotations", strings.Join(ig, ","))
	}
	if err := wl.Validate(); err != nil {
		// Refused: the pod gets no lane (not the one it asked for
		// before either: its request is what it says now).
		w.warnOnce(id, "invalid:"+err.Error(), "pod's lane request refused", "pod", wl.Name, "error", err.Error())
		w.drop(id, wl.Name)
		return
	}
	if cur, ok := w.current(id); ok && sameWorkload(cur, wl) {
		return // a resync replay or a status change that does not matter
	}
	if err := w.opts.Sink.SetWorkload(wl); err != nil {
		w.warnOnce(id, "set:"+err.Error(), "pod's lane request not applied", "pod", wl.Name, "error", err.Error())
		return
	}
	delete(w.warned, id)
}

func (w *Watcher) remove(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drop(string(p.UID), p.Namespace+"/"+p.Name)
	delete(w.warned, string(p.UID))
}

// drop removes the pod's workload if the agent has it. Called with w.mu.
func (w *Watcher) drop(id, name string) {
	if _, ok := w.current(id); !ok {
		return
	}
	if err := w.opts.Sink.RemoveWorkload(workload.SourceKubernetes, id); err != nil {
		w.log.Error("workload not removed", "pod", name, "error", err.Error())
	}
}

func (w *Watcher) current(id string) (workload.Workload, bool) {
	for _, wl := range w.opts.Sink.WorkloadsOf(workload.SourceKubernetes) {
		if wl.ID == id {
			return wl, true
		}
	}
	return workload.Workload{}, false
}

func sameWorkload(a, b workload.Workload) bool {
	return a.Key() == b.Key() && a.Name == b.Name && slices.Equal(a.IPs, b.IPs) && a.Lane == b.Lane && a.Ports == b.Ports && a.Proto == b.Proto
}

// warnOnce logs a warning for the pod unless the same one (what) was the
// last logged for it.
func (w *Watcher) warnOnce(id, what, msg string, args ...any) {
	if w.warned[id] == what {
		return
	}
	w.warned[id] = what
	w.log.Warn(msg, args...)
}
