package kube

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/rxlane/rxlane/internal/workload"
)

// memSink holds workloads as the agent does (validated, keyed); the
// agent itself is exercised with a real API server in
// internal/agent's TestAgentKubernetes.
type memSink struct {
	mu sync.Mutex
	w  map[string]workload.Workload
}

func (s *memSink) SetWorkload(w workload.Workload) error {
	if err := w.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.w[w.Key()] = w
	return nil
}

func (s *memSink) RemoveWorkload(source, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.w, source+"/"+id)
	return nil
}

func (s *memSink) WorkloadsOf(source string) []workload.Workload {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []workload.Workload
	for _, w := range s.w {
		if w.Source == source {
			out = append(out, w)
		}
	}
	return out
}

// state is "key lane ports proto ips" per workload, sorted, ";"-joined.
func (s *memSink) state() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, w := range s.w {
		out = append(out, fmt.Sprintf("%s %s %s %s %v", w.Key(), w.Lane, w.Ports, w.Proto, w.IPs))
	}
	sort.Strings(out)
	return strings.Join(out, ";")
}

func pod(name, node string, ann map[string]string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

func high(ports string) map[string]string {
	return map[string]string{workload.AnnotationLane: "high", workload.AnnotationPorts: ports, workload.AnnotationProto: "udp"}
}

func TestFromPod(t *testing.T) {
	p := pod("web", "x", high("5201,8080-8090"), "10.244.1.5", "fd00::5")
	w, ok := FromPod(p)
	if !ok {
		t.Fatal("a pod on the pod network is a workload")
	}
	want := workload.Workload{Source: workload.SourceKubernetes, ID: "uid-web", Name: "ns/web",
		IPs:  []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5")},
		Lane: "high", Ports: "5201,8080-8090", Proto: "udp"}
	if w.Key() != want.Key() || w.Name != want.Name || !slices.Equal(w.IPs, want.IPs) || w.Lane != want.Lane || w.Ports != want.Ports || w.Proto != want.Proto {
		t.Fatalf("FromPod = %+v, want %+v", w, want)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	// Only status.podIP (an old API server): still its address.
	p.Status.PodIPs = nil
	if w, _ := FromPod(p); len(w.IPs) != 1 || w.IPs[0] != want.IPs[0] {
		t.Fatalf("podIP only: %v", w.IPs)
	}
	p.Spec.HostNetwork = true
	if _, ok := FromPod(p); ok {
		t.Fatal("a host-network pod is a workload: its addresses are the node's")
	}
	p.Spec.HostNetwork = false
	p.Status.Phase = corev1.PodSucceeded
	if _, ok := FromPod(p); ok {
		t.Fatal("a finished pod is a workload")
	}
}

func waitState(t *testing.T, s *memSink, what, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.state() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: workloads\n  %q\nwant\n  %q", what, s.state(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatcherFake follows pods through client-go's fake clientset: the
// informer path and the mapping (the fake does not apply field
// selectors, so the watcher's own node check is what keeps node y's pod
// out here; the list and watch are checked to carry the selector).
func TestWatcherFake(t *testing.T) {
	stale := workload.Workload{Source: workload.SourceKubernetes, ID: "uid-gone", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.99")}, Lane: "high"}
	cni := workload.Workload{Source: workload.SourceCNI, ID: "ctr", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.98")}, Lane: "high"}
	sink := &memSink{w: map[string]workload.Workload{stale.Key(): stale, cni.Key(): cni}}
	client := fake.NewClientset(
		pod("a", "x", high("7000"), "10.244.1.2"),
		pod("other", "y", high("7000"), "10.244.2.2"),
		pod("plain", "x", nil, "10.244.1.3"),
	)
	hostNet := pod("hostnet", "x", high("7000"), "192.168.1.10")
	hostNet.Spec.HostNetwork = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := New(Options{Node: "x", Client: client, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	pods := client.CoreV1().Pods("ns")
	cniState := "cni/ctr high   [10.244.1.98]"
	// Start: a's workload; the stale one (a pod deleted while the agent
	// was down) removed by the first resync; the CNI's untouched.
	waitState(t, sink, "start", cniState+";kubernetes/uid-a high 7000 udp [10.244.1.2]")

	for _, a := range client.Actions() {
		if r, ok := a.(k8stesting.ListAction); ok && r.GetResource().Resource == "pods" {
			if fs := r.GetListRestrictions().Fields.String(); fs != "spec.nodeName=x" {
				t.Errorf("list of pods with field selector %q, want spec.nodeName=x", fs)
			}
		}
		if r, ok := a.(k8stesting.WatchAction); ok && r.GetResource().Resource == "pods" {
			if fs := r.GetWatchRestrictions().Fields.String(); fs != "spec.nodeName=x" {
				t.Errorf("watch of pods with field selector %q, want spec.nodeName=x", fs)
			}
		}
	}

	if _, err := pods.Create(ctx, hostNet, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Annotation changed: the workload follows.
	a, _ := pods.Get(ctx, "a", metav1.GetOptions{})
	a.Annotations[workload.AnnotationPorts] = "7000-7010"
	if _, err := pods.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, sink, "ports changed", cniState+";kubernetes/uid-a high 7000-7010 udp [10.244.1.2]")

	// A plain pod annotated, asking also to skip netfilter: it gets its
	// lane, and nothing else (the annotation is ignored).
	p, _ := pods.Get(ctx, "plain", metav1.GetOptions{})
	p.Annotations = map[string]string{workload.AnnotationLane: "high", "rxlane.io/skip-netfilter": "true"}
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, sink, "plain annotated", cniState+";kubernetes/uid-a high 7000-7010 udp [10.244.1.2];kubernetes/uid-plain high   [10.244.1.3]")
	// A lane that is not one (a pod asking to bypass policy): refused,
	// and its earlier request goes with it.
	p, _ = pods.Get(ctx, "plain", metav1.GetOptions{})
	p.Annotations[workload.AnnotationLane] = "skip-policy"
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, sink, "bad lane refused", cniState+";kubernetes/uid-a high 7000-7010 udp [10.244.1.2]")

	// A pod created without an address yet, then given one.
	late := pod("late", "x", high("8000"))
	late.Status.Phase = corev1.PodPending
	if _, err := pods.Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, sink, "pending pod", cniState+";kubernetes/uid-a high 7000-7010 udp [10.244.1.2];kubernetes/uid-late high 8000 udp []")
	late.Status.Phase = corev1.PodRunning
	late.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.4"}}
	if _, err := pods.UpdateStatus(ctx, late, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, sink, "pod got its address", cniState+";kubernetes/uid-a high 7000-7010 udp [10.244.1.2];kubernetes/uid-late high 8000 udp [10.244.1.4]")

	// Deleted: gone.
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(ctx, "late", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, sink, "pods deleted", cniState)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestNewNeedsNode(t *testing.T) {
	if _, err := New(Options{Client: fake.NewClientset(), Sink: &memSink{}}); err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Fatalf("New without a node: %v", err)
	}
}
