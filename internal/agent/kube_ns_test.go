package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/orchestrator/kube/kubetest"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/workload"
)

// chartClusterRole is the ClusterRole of the plain manifest (the chart's
// rendering): the agent's user gets exactly the rights the DaemonSet's
// service account has.
func chartClusterRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/rxlane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var cr rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &cr); err == nil && cr.Kind == "ClusterRole" {
			cr.ResourceVersion = ""
			return &cr
		}
	}
	t.Fatal("no ClusterRole in deploy/kubernetes/rxlane.yaml")
	return nil
}

// TestAgentKubernetes runs the agent's pod watcher against a real API
// server (etcd and kube-apiserver on loopback), as the DaemonSet's
// service account (the chart's ClusterRole bound to the agent's user):
// pods created with annotations on node-x and node-y, their status
// written as a kubelet would; the agent's workloads lane on the testbed
// gets the rules of node-x's annotated pods only and counts their
// traffic; annotation changes, a lane asking to skip policy, a pod
// deleted while the agent runs and one deleted while it is down (the
// start's resync) are followed.
func TestAgentKubernetes(t *testing.T) {
	testbedtest.RequireRoot(t)
	c := kubetest.Start(t)
	admin := c.Client(t, kubetest.Admin)
	ctx := context.Background()
	cr := chartClusterRole(t)
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rxlane-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: cr.Name},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: kubetest.Agent}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The agent's user can read pods and nothing else.
	agentClient := c.Client(t, kubetest.Agent)
	if _, err := agentClient.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the chart's role lets the agent read config maps")
	}
	const ns = "rxlane-test"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := admin.CoreV1().Pods(ns)

	tb := testbedtest.Up(t, testbedtest.Config(t))
	testbedtest.BridgeNetfilterOff(t, testbed.NetnsPath(tb, testbed.HostB))
	before := testbedtest.Snapshot(t, tb)
	file, cfg := workloadsConfig(t, tb.NS(testbed.HostB), fmt.Sprintf(`kubernetes:
  node_name: node-x
  kubeconfig: %s
`, c.Kubeconfig(t, kubetest.Agent)))

	ctrB := testbed.OverlayB.String()
	web := mkPod(t, admin, ns, "web", "node-x", false, map[string]string{workload.AnnotationLane: "high", workload.AnnotationPorts: "7000", workload.AnnotationProto: "udp"}, ctrB)
	elsewhere := mkPod(t, admin, ns, "elsewhere", "node-y", false, map[string]string{workload.AnnotationLane: "high"}, "10.99.1.2")
	mkPod(t, admin, ns, "plain", "node-x", false, nil, "10.99.0.3")
	mkPod(t, admin, ns, "hostnet", "node-x", true, map[string]string{workload.AnnotationLane: "high"}, "192.0.2.10")
	batch := mkPod(t, admin, ns, "batch", "node-x", false, map[string]string{workload.AnnotationLane: "high", workload.AnnotationPorts: "9000"}, "10.99.0.4")

	a, stop := startAgent(t, Options{ConfigFile: file})
	st := a.Stores()[0]
	// kube is "uid:ports:ips" of each kubernetes workload, by key.
	kube := func() string {
		var k []string
		for _, w := range a.WorkloadsOf(workload.SourceKubernetes) {
			k = append(k, fmt.Sprintf("%s:%s:%v", w.ID, w.Ports, w.IPs))
		}
		return strings.Join(k, ",")
	}
	webW := func(ports string) string { return fmt.Sprintf("%s:%s:[%s]", web, ports, ctrB) }
	batchW := fmt.Sprintf("%s:9000:[10.99.0.4]", batch)
	sorted := func(a, b string) string {
		if a > b {
			a, b = b, a
		}
		return a + "," + b
	}
	waitFor(t, "node-x's annotated pods as workloads", func() bool { return kube() == sorted(webW("7000"), batchW) })
	send(t, tb, 7000, 20)
	if n, _ := rulePackets(t, st, 7000); n != 20 {
		t.Fatalf("the pod's rule counted %d, want 20", n)
	}

	// The annotation changed: the lane follows.
	patch := func(name, annotations string) {
		t.Helper()
		p := fmt.Sprintf(`{"metadata":{"annotations":%s}}`, annotations)
		if _, err := pods.Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch("web", `{"rxlane.io/ports":"7001"}`)
	waitFor(t, "the new ports", func() bool { return kube() == sorted(webW("7001"), batchW) })
	send(t, tb, 7001, 5)
	if n, _ := rulePackets(t, st, 7001); n != 5 {
		t.Fatalf("the changed rule counted %d, want 5", n)
	}
	if _, ok := rulePackets(t, st, 7000); ok {
		t.Fatal("the old port's rule is still there")
	}
	// A pod asking to skip policy: refused, its lane goes; the lane
	// itself still skips nothing (the config says so, not the pod).
	patch("web", `{"rxlane.io/lane":"skip-policy"}`)
	waitFor(t, "the refused request removed", func() bool { return kube() == batchW })
	if _, ok := rulePackets(t, st, 7001); ok {
		t.Fatal("a refused request kept its rule")
	}
	patch("web", `{"rxlane.io/lane":"high","rxlane.io/skip-netfilter":"true"}`)
	waitFor(t, "the lane back, the skip ignored", func() bool { return kube() == sorted(webW("7001"), batchW) })
	if a.Config().Lanes[0].SkipNetfilter {
		t.Fatal("a pod's annotation changed the lane's netfilter setting")
	}

	// Deleted while the agent runs.
	if err := pods.Delete(ctx, "batch", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod's workload gone", func() bool { return kube() == webW("7001") })
	// Deleted while the agent is down: the start's resync removes it
	// (the workloads were kept across the restart).
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	a, stop = startAgent(t, Options{ConfigFile: file})
	waitFor(t, "the resync after the restart", func() bool { return kube() == "" })
	if ls := a.Status().Lanes[0]; len(ls.Rules) != 0 {
		t.Fatalf("lane rules after the pods went: %+v", ls.Rules)
	}
	late := mkPod(t, admin, ns, "late", "node-x", false, map[string]string{workload.AnnotationLane: "high"}, "10.99.0.5")
	waitFor(t, "the late pod's workload", func() bool { return kube() == late+"::[10.99.0.5]" })
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	conf := string(text)
	noKube := conf[:strings.Index(conf, "kubernetes:")]
	reloadKube(t, a, st, file, conf, noKube, kube, late+"::[10.99.0.5]", elsewhere+"::[10.99.1.2]")

	// The kubernetes section removed, the agent restarted: the watcher's
	// workloads of the earlier run are dropped.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, file, noKube)
	a, stop = startAgent(t, Options{ConfigFile: file})
	if k := kube(); k != "" {
		t.Fatalf("kubernetes workloads without a kubernetes section: %s", k)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("cleanup did not restore the testbed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// reloadKube changes the kubernetes section of the running agent by
// reloads (conf has it for node-x; noKube is conf without it): node-y
// instead of node-x restarts the watcher on node-y's pods (x's workload,
// xW, goes and y's, yW, comes); a kubeconfig that is not there refuses
// the reload with nothing changed; the section removed drops the
// kubernetes workloads at once; put back, node-x's pod is back. Neither
// a CNI workload nor the lane's programs are touched by any of it.
func reloadKube(t *testing.T, a *Agent, st *lanes.Store, file, conf, noKube string, kube func() string, xW, yW string) {
	t.Helper()
	cni := workload.Workload{Source: workload.SourceCNI, ID: "c0ffee/eth0", Name: "cni-pod",
		IPs: []netip.Addr{netip.MustParseAddr("10.99.0.9")}, Lane: workload.LaneHigh, Ports: "7100"}
	if err := a.SetWorkload(cni); err != nil {
		t.Fatal(err)
	}
	ids := laneProgIDs(t, st)
	untouched := func(what string) {
		t.Helper()
		if ws := a.WorkloadsOf(workload.SourceCNI); len(ws) != 1 || ws[0].ID != cni.ID {
			t.Fatalf("%s: the CNI workloads are %+v, want the one set", what, ws)
		}
		if _, ok := rulePackets(t, st, 7100); !ok {
			t.Fatalf("%s: the CNI workload's rule is gone", what)
		}
		if got := laneProgIDs(t, st); !maps.Equal(got, ids) {
			t.Fatalf("%s: the lane's programs reattached: %v before, %v after", what, ids, got)
		}
	}
	reload := func(text string) error {
		t.Helper()
		writeConfig(t, file, text)
		return a.Reload()
	}

	if err := reload(strings.Replace(conf, "node_name: node-x", "node_name: node-y", 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node-y's pod instead of node-x's after the reload", func() bool { return kube() == yW })
	untouched("node_name changed")

	if err := reload(strings.Replace(conf, "kubeconfig: ", "kubeconfig: /nonexistent", 1)); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Fatalf("reload with a kubeconfig that is not there: %v, want refused", err)
	}
	if k := a.Config().Kubernetes; k == nil || k.NodeName != "node-y" {
		t.Fatalf("a refused reload changed the running config: %+v", k)
	}
	if k := kube(); k != yW {
		t.Fatalf("a refused reload changed the workloads: %s, want %s", k, yW)
	}

	// Dropped when Reload returns: nothing would keep them current.
	if err := reload(noKube); err != nil {
		t.Fatal(err)
	}
	if k := kube(); k != "" {
		t.Fatalf("kubernetes workloads after the section's removal: %s", k)
	}
	untouched("section removed")

	if err := reload(conf); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node-x's pod back with the section", func() bool { return kube() == xW })
	untouched("section back")
	if err := a.RemoveWorkload(cni.Source, cni.ID); err != nil {
		t.Fatal(err)
	}
}

// mkPod creates a pod bound to node and writes its status as the node's
// kubelet would (Running, status.podIPs = ip). It returns the pod's UID.
func mkPod(t *testing.T, cs kubernetes.Interface, ns, name, node string, hostNet bool, ann map[string]string, ip string) string {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: hostNet,
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
	}
	p, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if hostNet {
		p.Status.HostIP = ip
	}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := netip.ParseAddr(ip); err != nil {
		t.Fatal(err)
	}
	return string(p.UID)
}
