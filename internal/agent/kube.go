package agent

import (
	"context"
	"os"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/rxlane/rxlane/internal/orchestrator/kube"
	"github.com/rxlane/rxlane/internal/workload"
)

// KubernetesConfig is the config's kubernetes section: the agent watches
// its node's pods and gives the lanes with `workloads: true` the lanes
// their annotations ask for (internal/orchestrator/kube). Read at start:
// a reload that changes it is applied at the agent's next start.
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

// kubeWatcher makes the pod watcher when the config has a kubernetes
// section; start runs it (until ctx ends) and returns a wait that
// returns once it has stopped. A client that cannot be made (no
// kubeconfig, not in a cluster) is an error: the agent does not start
// half of what its config asks.
func (a *Agent) kubeWatcher() (start func(ctx context.Context) (wait func()), err error) {
	k := a.cfg.Kubernetes
	if k == nil {
		return func(context.Context) func() {
			// Kubernetes workloads of an earlier run with a kubernetes
			// section: nothing would keep them current now (their pods
			// may go, their addresses be reused).
			a.dropWorkloadsOf(workload.SourceKubernetes, "no kubernetes section")
			return func() {}
		}, nil
	}
	client, err := kube.Client(k.Kubeconfig)
	if err != nil {
		return nil, err
	}
	w, err := kube.New(kube.Options{Node: k.NodeName, Client: client, Sink: a, Log: a.log})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) func() {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil && ctx.Err() == nil {
				a.log.Error("kubernetes pod watcher stopped", "error", err.Error())
			}
		}()
		return wg.Wait
	}, nil
}
