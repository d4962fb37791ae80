// Package deploy_test checks the Helm chart deploy/helm/rxlane and the
// plain manifest deploy/kubernetes/rxlane.yaml: helm lint, helm template
// with default and customised values, every rendered object decoded
// strictly into its k8s.io/api type (an unknown or misspelt field is an
// error), the manifest current, and every object accepted by a real API
// server (its validation: what decoding cannot see).
package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/orchestrator/kube/kubetest"
)

const chart = "helm/rxlane"

func helmBin(t *testing.T) string {
	t.Helper()
	dir := kubetest.BinDir
	if c := os.Getenv("RXLANE_CACHE"); c != "" {
		dir = filepath.Join(c, "bin")
	}
	if p := filepath.Join(dir, "helm"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	t.Fatalf("no helm in %s or $PATH: run scripts/setup-kube", dir)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func helm(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// No user's helm state (repositories, plugins) is read or written.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// objects is what a rendering holds, decoded strictly.
type objects struct {
	sa   []corev1.ServiceAccount
	cm   []corev1.ConfigMap
	ds   []appsv1.DaemonSet
	cr   []rbacv1.ClusterRole
	crb  []rbacv1.ClusterRoleBinding
	kind []string
}

// decodeAll splits a multi-document YAML stream and decodes each object
// into its type with unknown fields rejected.
func decodeAll(t *testing.T, stream string) objects {
	t.Helper()
	var o objects
	for i, doc := range strings.Split(stream, "\n---") {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		if head.Kind == "" {
			if strings.TrimSpace(stripComments(doc)) != "" {
				t.Fatalf("document %d has no kind:\n%s", i, doc)
			}
			continue
		}
		strict := func(v any) {
			if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
				t.Fatalf("%s (document %d): %v\n%s", head.Kind, i, err, doc)
			}
		}
		want := map[string]string{"ServiceAccount": "v1", "ConfigMap": "v1", "DaemonSet": "apps/v1",
			"ClusterRole": "rbac.authorization.k8s.io/v1", "ClusterRoleBinding": "rbac.authorization.k8s.io/v1"}
		if want[head.Kind] != head.APIVersion {
			t.Fatalf("document %d: unexpected %s %s", i, head.APIVersion, head.Kind)
		}
		o.kind = append(o.kind, head.Kind)
		switch head.Kind {
		case "ServiceAccount":
			var v corev1.ServiceAccount
			strict(&v)
			o.sa = append(o.sa, v)
		case "ConfigMap":
			var v corev1.ConfigMap
			strict(&v)
			o.cm = append(o.cm, v)
		case "DaemonSet":
			var v appsv1.DaemonSet
			strict(&v)
			o.ds = append(o.ds, v)
		case "ClusterRole":
			var v rbacv1.ClusterRole
			strict(&v)
			o.cr = append(o.cr, v)
		case "ClusterRoleBinding":
			var v rbacv1.ClusterRoleBinding
			strict(&v)
			o.crb = append(o.crb, v)
		}
	}
	return o
}

func stripComments(doc string) string {
	var out []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestStrictDecodeRejectsUnknownFields(t *testing.T) {
	// The decoding the tests rely on: a misspelt field fails.
	var ds appsv1.DaemonSet
	err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n"), &ds)
	if err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
		t.Fatalf("misspelt field: %v", err)
	}
}

func TestHelmLint(t *testing.T) {
	out := helm(t, "lint", "--strict", chart)
	if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
		t.Fatalf("helm lint:\n%s", out)
	}
}

func TestChartDefault(t *testing.T) {
	o := decodeAll(t, helm(t, "template", "rxlane", chart, "--namespace", "kube-system"))
	slices.Sort(o.kind)
	if got := strings.Join(o.kind, ","); got != "ClusterRole,ClusterRoleBinding,ConfigMap,DaemonSet,ServiceAccount" {
		t.Fatalf("kinds %s", got)
	}
	ds := o.ds[0]
	ps := ds.Spec.Template.Spec
	if !ps.HostNetwork || ps.HostPID || ps.HostIPC {
		t.Fatalf("host namespaces: network %v pid %v ipc %v, want the network only", ps.HostNetwork, ps.HostPID, ps.HostIPC)
	}
	if ps.ServiceAccountName != o.sa[0].Name || ds.Namespace != "kube-system" {
		t.Fatalf("service account %q (made %q), namespace %q", ps.ServiceAccountName, o.sa[0].Name, ds.Namespace)
	}
	if len(ps.Containers) != 2 || len(ps.InitContainers) != 1 || ps.Containers[0].Name != "agent" || ps.Containers[1].Name != "cni-watch" {
		t.Fatalf("containers %d, init containers %d: want the agent and the cni-watch sidecar, and the install", len(ps.Containers), len(ps.InitContainers))
	}
	c := ps.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil {
		t.Fatalf("agent security context %+v: want not privileged, with capabilities", sc)
	}
	var caps []string
	for _, cp := range sc.Capabilities.Add {
		caps = append(caps, string(cp))
	}
	slices.Sort(caps)
	if strings.Join(caps, ",") != "BPF,NET_ADMIN,PERFMON,SYS_ADMIN,SYS_RESOURCE" || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Fatalf("capabilities add %v drop %v", caps, sc.Capabilities.Drop)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, p := range []string{"/sys/fs/bpf", "/run/netns", "/run/rxlane", "/etc/rxlane"} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("agent has no mount at %s", p)
		}
	}
	// The CNI directories are the sidecar's and the init container's.
	for _, p := range []string{"/host/etc/cni/net.d", "/host/opt/cni/bin"} {
		if _, ok := mounts[p]; ok {
			t.Errorf("agent mounts %s: only the CNI containers write there", p)
		}
	}
	for _, p := range []string{"/sys/fs/bpf", "/run/netns"} {
		if m := mounts[p]; m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
			t.Errorf("%s: propagation %v, want HostToContainer (mounts made after the agent started)", p, m.MountPropagation)
		}
	}
	hostPaths := map[string]string{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	if hostPaths["bpffs"] != "/sys/fs/bpf" || hostPaths["netns"] != "/run/netns" || hostPaths["cni-conf"] != "/etc/cni/net.d" || hostPaths["cni-bin"] != "/opt/cni/bin" {
		t.Fatalf("host paths %v", hostPaths)
	}
	var node bool
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			node = true
		}
	}
	if !node {
		t.Fatal("no NODE_NAME from spec.nodeName")
	}
	// Install in the init container, kept chained by the sidecar,
	// uninstalled when the pod stops (the sidecar's preStop).
	if slices.Contains(c.Command, "--cleanup-on-exit") {
		t.Fatal("the default agent disables its lanes when its pod stops (an update would detach them)")
	}
	ic, w := ps.InitContainers[0], ps.Containers[1]
	if !slices.Contains(ic.Command, "--install") || slices.Contains(ic.Command, "--watch") {
		t.Fatalf("install %v", ic.Command)
	}
	if !slices.Contains(w.Command, "--install") || !slices.Contains(w.Command, "--watch") || w.Lifecycle == nil || w.Lifecycle.PreStop == nil || !slices.Contains(w.Lifecycle.PreStop.Exec.Command, "--uninstall") {
		t.Fatalf("watch %v, preStop %+v", w.Command, w.Lifecycle)
	}
	if c.Lifecycle != nil {
		t.Fatalf("agent lifecycle %+v: the uninstall is the sidecar's", c.Lifecycle)
	}
	for _, x := range []corev1.Container{ic, w} {
		if x.SecurityContext == nil || x.SecurityContext.Capabilities == nil || len(x.SecurityContext.Capabilities.Add) != 0 ||
			!slices.Equal(x.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Fatalf("%s security context %+v: want no capability", x.Name, x.SecurityContext)
		}
		var dirs []string
		for _, m := range x.VolumeMounts {
			dirs = append(dirs, m.MountPath)
		}
		if !slices.Equal(dirs, []string{"/host/etc/cni/net.d", "/host/opt/cni/bin"}) {
			t.Fatalf("%s mounts %v: want the CNI directories only", x.Name, dirs)
		}
	}
	// RBAC: read pods, nothing else.
	if len(o.cr) != 1 || len(o.cr[0].Rules) != 1 {
		t.Fatalf("cluster role %+v", o.cr)
	}
	r := o.cr[0].Rules[0]
	if strings.Join(r.APIGroups, ",") != "" || strings.Join(r.Resources, ",") != "pods" || strings.Join(r.Verbs, ",") != "get,list,watch" {
		t.Fatalf("cluster role rule %+v, want get/list/watch on pods", r)
	}
	b := o.crb[0]
	if b.RoleRef.Name != o.cr[0].Name || len(b.Subjects) != 1 || b.Subjects[0].Name != o.sa[0].Name || b.Subjects[0].Namespace != "kube-system" {
		t.Fatalf("binding %+v", b)
	}
	// The ConfigMap's config is one the agent accepts.
	t.Setenv("NODE_NAME", "node-a")
	cfg, err := agent.ParseConfig("agent.yaml", []byte(o.cm[0].Data["agent.yaml"]))
	if err != nil {
		t.Fatalf("the chart's agent config: %v", err)
	}
	if cfg.Kubernetes == nil || cfg.Kubernetes.NodeName != "node-a" || len(cfg.Lanes) != 1 || !cfg.Lanes[0].Workloads || cfg.Lanes[0].SkipNetfilter {
		t.Fatalf("the chart's agent config: %+v", cfg)
	}
}

func TestChartCustom(t *testing.T) {
	vals := filepath.Join(t.TempDir(), "values.yaml")
	err := os.WriteFile(vals, []byte(`image:
  repository: registry.example/rxlane
  tag: v9
cni:
  install: false
stateDir: /var/lib/rxlane
serviceAccount:
  create: false
  name: node-agent
config: |
  lanes:
    - netns: /var/run/docker/netns/1-abc
      mode: queue
  kubernetes:
    node_name: n1
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	o := decodeAll(t, helm(t, "template", "lanes", chart, "--namespace", "rx", "-f", vals, "--set", "metricsPort=9500", "--set", "cleanupOnExit=true"))
	slices.Sort(o.kind)
	if got := strings.Join(o.kind, ","); got != "ClusterRole,ClusterRoleBinding,ConfigMap,DaemonSet" {
		t.Fatalf("kinds %s (no ServiceAccount made)", got)
	}
	ps := o.ds[0].Spec.Template.Spec
	c := ps.Containers[0]
	if ps.ServiceAccountName != "node-agent" || o.crb[0].Subjects[0].Name != "node-agent" || o.crb[0].Subjects[0].Namespace != "rx" {
		t.Fatalf("service account %q, binding %+v", ps.ServiceAccountName, o.crb[0].Subjects)
	}
	if len(ps.InitContainers) != 0 || len(ps.Containers) != 1 || c.Lifecycle != nil {
		t.Fatalf("cni.install false: init containers %d, containers %d, lifecycle %+v", len(ps.InitContainers), len(ps.Containers), c.Lifecycle)
	}
	if c.Image != "registry.example/rxlane:v9" || c.ReadinessProbe.HTTPGet.Port.IntValue() != 9500 || !slices.Contains(c.Command, "127.0.0.1:9500") || !slices.Contains(c.Command, "--cleanup-on-exit") {
		t.Fatalf("image %q, probe %+v, command %v", c.Image, c.ReadinessProbe.HTTPGet, c.Command)
	}
	for _, v := range ps.Volumes {
		if strings.HasPrefix(v.Name, "cni-") {
			t.Fatalf("cni.install false: volume %s", v.Name)
		}
		if v.Name == "state" && v.HostPath.Path != "/var/lib/rxlane" {
			t.Fatalf("state dir %s", v.HostPath.Path)
		}
	}
	if !strings.Contains(o.cm[0].Data["agent.yaml"], "node_name: n1") {
		t.Fatalf("config %q", o.cm[0].Data["agent.yaml"])
	}
}

// TestManifestCurrent: the committed plain manifest is the chart's
// default rendering (scripts/gen-manifest; `make manifest` rewrites it).
func TestManifestCurrent(t *testing.T) {
	want, err := os.ReadFile("kubernetes/rxlane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("../scripts/gen-manifest", "-")
	cmd.Env = append(os.Environ(), "RXLANE_CACHE="+filepath.Dir(filepath.Dir(helmBin(t))))
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/gen-manifest: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/kubernetes/rxlane.yaml is not the chart's rendering: run 'make manifest' and commit")
	}
	decodeAll(t, string(want))
}

// TestManifestAccepted creates every object of the plain manifest in a
// real API server: its validation (security context rules, probe and
// volume checks) passes.
func TestManifestAccepted(t *testing.T) {
	b, err := os.ReadFile("kubernetes/rxlane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := decodeAll(t, string(b))
	c := kubetest.Start(t)
	cs := c.Client(t, kubetest.Admin)
	ctx := context.Background()
	create := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s refused by the API server: %v", what, err)
		}
	}
	for _, v := range o.sa {
		_, err := cs.CoreV1().ServiceAccounts(v.Namespace).Create(ctx, &v, metav1.CreateOptions{FieldValidation: "Strict"})
		create("ServiceAccount "+v.Name, err)
	}
	for _, v := range o.cm {
		_, err := cs.CoreV1().ConfigMaps(v.Namespace).Create(ctx, &v, metav1.CreateOptions{FieldValidation: "Strict"})
		create("ConfigMap "+v.Name, err)
	}
	for _, v := range o.cr {
		_, err := cs.RbacV1().ClusterRoles().Create(ctx, &v, metav1.CreateOptions{FieldValidation: "Strict"})
		create("ClusterRole "+v.Name, err)
	}
	for _, v := range o.crb {
		_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &v, metav1.CreateOptions{FieldValidation: "Strict"})
		create("ClusterRoleBinding "+v.Name, err)
	}
	for _, v := range o.ds {
		_, err := cs.AppsV1().DaemonSets(v.Namespace).Create(ctx, &v, metav1.CreateOptions{FieldValidation: "Strict"})
		create(fmt.Sprintf("DaemonSet %s", v.Name), err)
	}
}
