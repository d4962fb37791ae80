package agent

import (
	"os"

	"gopkg.in/yaml.v3"

	"github.com/rxlane/rxlane/internal/orchestrator/kube"
)

// KubernetesConfig is the config's kubernetes section: the agent watches
// its node's pods and gives the lanes with `workloads: true` the lanes
// their annotations ask for (internal/orchestrator/kube). A reload that
// changes it restarts the watcher (watchers.go).
type KubernetesConfig struct {
	// NodeName is the node whose pods are watched (default $NODE_NAME,
	// which the DaemonSet sets from spec.nodeName).
	NodeName string `json:"node_name"`
	// Kubeconfig is a kubeconfig file; "" means in-cluster (the pod's
	// service account).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	Line       int    `json:"line"`
}

// kubernetes decodes the kubernetes section.
func (d *decoder) kubernetes(n *yaml.Node, path string) *KubernetesConfig {
	k := &KubernetesConfig{Line: n.Line}
	given := false // node_name given (a bad one is its own problem)
	if l, ok := d.keyLine[n]; ok {
		k.Line = l
	}
	// `kubernetes:` alone (null) or `kubernetes: {}`: every default.
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		k.NodeName = os.Getenv("NODE_NAME")
	} else {
		f := d.fields(n, path, "node_name", "kubeconfig")
		if v := f["node_name"]; v != nil {
			given = true
			if s, ok := d.str(v, path+".node_name"); ok {
				if k.NodeName = s; s == "" {
					d.fail(v, path+".node_name", "empty: want the node's name (or leave it out for $NODE_NAME)")
				}
			}
		} else {
			k.NodeName = os.Getenv("NODE_NAME")
		}
		if v := f["kubeconfig"]; v != nil {
			k.Kubeconfig = d.absPath(v, path+".kubeconfig")
		}
	}
	if k.NodeName == "" && !given {
		d.fail(n, path+".node_name", "no node name: give node_name, or set $NODE_NAME (the DaemonSet sets it from spec.nodeName)")
	}
	return k
}

// sameKube: the two sections make the same watcher (nil: none).
func sameKube(a, b *KubernetesConfig) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.NodeName == b.NodeName && a.Kubeconfig == b.Kubeconfig
}

// newKubeWatcher makes the pod watcher of a kubernetes section. A client
// that cannot be made (no kubeconfig, not in a cluster) is an error,
// found before anything is applied: the agent neither starts nor reloads
// half of what its config asks.
func (a *Agent) newKubeWatcher(k *KubernetesConfig) (*kube.Watcher, error) {
	client, err := kube.Client(k.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return kube.New(kube.Options{Node: k.NodeName, Client: client, Sink: a, Log: a.log})
}
