package agent

import (
	"errors"
	"strings"
	"testing"
)

func TestConfigKubernetes(t *testing.T) {
	const lanes = "lanes:\n  - netns: /proc/self/ns/net\n    workloads: true\n"
	t.Setenv("NODE_NAME", "node-env")
	for _, tc := range []struct {
		name, yaml     string
		node, kubeconf string
	}{
		{"defaults (null)", lanes + "kubernetes:\n", "node-env", ""},
		{"defaults ({})", lanes + "kubernetes: {}\n", "node-env", ""},
		{"given", lanes + "kubernetes:\n  node_name: n1\n  kubeconfig: /etc/rxlane/kubeconfig\n", "n1", "/etc/rxlane/kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("agent.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			k := cfg.Kubernetes
			if k == nil || k.NodeName != tc.node || k.Kubeconfig != tc.kubeconf || k.Line != 4 {
				t.Fatalf("kubernetes %+v, want node %q kubeconfig %q at line 4", k, tc.node, tc.kubeconf)
			}
		})
	}
	if cfg, err := ParseConfig("agent.yaml", []byte(lanes)); err != nil || cfg.Kubernetes != nil {
		t.Fatalf("no kubernetes section: %+v, %v", cfg.Kubernetes, err)
	}
}

func TestConfigKubernetesErrors(t *testing.T) {
	const lanes = "lanes:\n  - netns: /proc/self/ns/net\n    workloads: true\n"
	for _, tc := range []struct {
		name, yaml, env, want string
	}{
		{"no node name", lanes + "kubernetes: {}\n", "",
			"agent.yaml:4: kubernetes.node_name: no node name: give node_name, or set $NODE_NAME (the DaemonSet sets it from spec.nodeName)"},
		{"unknown field", lanes + "kubernetes:\n  node: n1\n", "n",
			"agent.yaml:5: kubernetes.node: unknown field (known: node_name, kubeconfig)"},
		{"relative kubeconfig", lanes + "kubernetes:\n  node_name: n1\n  kubeconfig: kube.conf\n", "",
			`agent.yaml:6: kubernetes.kubeconfig: "kube.conf": want an absolute path`},
		{"node name not a string", lanes + "kubernetes:\n  node_name: [a]\n", "",
			"agent.yaml:5: kubernetes.node_name: want a string, got a list"},
		{"empty node name", lanes + "kubernetes:\n  node_name: \"\"\n", "n",
			"agent.yaml:5: kubernetes.node_name: empty: want the node's name (or leave it out for $NODE_NAME)"},
		{"not a mapping", lanes + "kubernetes: yes\n", "n",
			`agent.yaml:4: kubernetes: want a mapping, got "yes"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tc.env)
			_, err := ParseConfig("agent.yaml", []byte(tc.yaml))
			var ce *ConfigError
			if !errors.As(err, &ce) || len(ce.Problems) != 1 || err.Error() != tc.want {
				t.Fatalf("got\n  %v\nwant\n  %s", err, tc.want)
			}
		})
	}
}

// TestKubeWatcherNeedsClient: a kubernetes section the agent cannot
// follow (no kubeconfig file, not in a cluster) stops the start before
// anything is applied.
func TestKubeWatcherNeedsClient(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tc := range []struct{ kubeconfig, want string }{
		{"", "not in a cluster"},
		{"/nonexistent/kubeconfig", "no such file"},
	} {
		a := &Agent{}
		if _, err := a.newKubeWatcher(&KubernetesConfig{NodeName: "n", Kubeconfig: tc.kubeconfig}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("kubeconfig %q: %v, want %q", tc.kubeconfig, err, tc.want)
		}
	}
}
