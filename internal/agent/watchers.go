package agent

import (
	"context"

	"github.com/rxlane/rxlane/internal/orchestrator/docker"
	"github.com/rxlane/rxlane/internal/orchestrator/kube"
	"github.com/rxlane/rxlane/internal/workload"
)

// The orchestrator watchers (the docker and kubernetes sections): each
// runs in its own goroutine until the agent stops or a reload changes its
// section. A changed section stops the old watcher and starts one with
// the new section, whose first resync makes the source's workloads those
// the new section sees (a workload of a node or network no longer
// watched goes); a removed section drops the source's workloads, since
// nothing would keep them current (their containers may go, their
// addresses be reused). Lanes and the workloads of other sources are not
// touched: a watcher only sets and removes its own source's.

// watcherRun is one running watcher.
type watcherRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the watcher and waits for it. Called without a.mu: the
// watcher may be inside a SetWorkload, which takes it.
func (r *watcherRun) stop() {
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

func (a *Agent) goWatcher(run func(ctx context.Context)) *watcherRun {
	ctx, cancel := context.WithCancel(a.ctx)
	r := &watcherRun{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		run(ctx)
	}()
	return r
}

// startWatchers makes the watchers those of cfg (old: the configuration
// they run with, nil at start). kw is the pod watcher made for cfg's
// kubernetes section when it differs from old's (newKubeWatcher, made
// before anything was applied). Called from Run's goroutine, without
// a.mu.
func (a *Agent) startWatchers(old, cfg *Config, kw *kube.Watcher) {
	var oldDocker *DockerConfig
	var oldKube *KubernetesConfig
	if old != nil {
		oldDocker, oldKube = old.Docker, old.Kubernetes
	}
	if old == nil || !sameDocker(oldDocker, cfg.Docker) {
		a.dockerRun.stop()
		a.dockerRun = nil
		switch {
		case cfg.Docker == nil && old == nil:
			a.dropWorkloadsOf(workload.SourceDocker, "no docker section")
		case cfg.Docker == nil:
			a.log.Info("docker section removed: watcher stopped")
			a.dropWorkloadsOf(workload.SourceDocker, "docker section removed")
		default:
			if old != nil {
				a.log.Info("docker section changed: watcher restarted", "socket", cfg.Docker.Socket, "resync", cfg.Docker.Resync.String())
			}
			w := docker.New(docker.Options{Socket: cfg.Docker.Socket, Networks: cfg.Docker.Networks, Resync: cfg.Docker.Resync,
				Log: a.log, OnSync: a.opts.OnDockerSync})
			a.dockerRun = a.goWatcher(func(ctx context.Context) { w.Run(ctx, a) })
		}
	}
	if old == nil || !sameKube(oldKube, cfg.Kubernetes) {
		a.kubeRun.stop()
		a.kubeRun = nil
		switch {
		case cfg.Kubernetes == nil && old == nil:
			a.dropWorkloadsOf(workload.SourceKubernetes, "no kubernetes section")
		case cfg.Kubernetes == nil:
			a.log.Info("kubernetes section removed: pod watcher stopped")
			a.dropWorkloadsOf(workload.SourceKubernetes, "kubernetes section removed")
		default:
			if old != nil {
				a.log.Info("kubernetes section changed: pod watcher restarted", "node", cfg.Kubernetes.NodeName)
			}
			a.kubeRun = a.goWatcher(func(ctx context.Context) {
				if err := kw.Run(ctx); err != nil && ctx.Err() == nil {
					a.log.Error("kubernetes pod watcher stopped", "error", err.Error())
				}
			})
		}
	}
}

// stopWatchers stops both watchers (the agent's stop).
func (a *Agent) stopWatchers() {
	a.dockerRun.stop()
	a.kubeRun.stop()
	a.dockerRun, a.kubeRun = nil, nil
}
