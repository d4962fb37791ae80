package agent

import (
	"fmt"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/rxlane/rxlane/internal/orchestrator/docker"
	"github.com/rxlane/rxlane/internal/workload"
)

// DockerConfig is the configuration's docker section: the agent watches
// that engine and gives the containers labelled rxlane.lane=high a lane
// (docs/orchestrators.md, "Docker labels").
type DockerConfig struct {
	// Socket is the Engine API's Unix socket.
	Socket string `json:"socket"`
	// Networks, if set, are the networks (names or IDs) whose addresses
	// count; by default those of the overlay driver.
	Networks []string `json:"networks,omitempty"`
	Line     int      `json:"line"`
}

// docker parses the docker section. It needs a lanes entry that takes
// workloads: without one, the labels could change nothing.
func (d *decoder) docker(n *yaml.Node, path string, ls []LaneConfig) *DockerConfig {
	c := &DockerConfig{Socket: docker.DefaultSocket, Line: n.Line}
	if l, ok := d.keyLine[n]; ok {
		c.Line = l
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		// "docker:" alone: the defaults.
	} else {
		f := d.fields(n, path, "socket", "networks")
		if v := f["socket"]; v != nil {
			c.Socket = d.absPath(v, path+".socket")
		}
		if v := f["networks"]; v != nil {
			c.Networks = d.strings(v, path+".networks")
			for i, s := range c.Networks {
				if s == "" {
					d.fail(v.Content[i], fmt.Sprintf("%s.networks[%d]", path, i), "empty network name")
				}
			}
			if len(c.Networks) == 0 && v.Kind == yaml.SequenceNode {
				d.fail(v, path+".networks", "empty list: leave it out for every overlay network")
			}
		}
	}
	if !slices.ContainsFunc(ls, func(l LaneConfig) bool { return l.Workloads }) {
		d.fail(n, path, "no lanes entry takes workloads: add workloads: true to the lane of the namespace where the overlay's VXLAN device is (for Docker's overlay, the network's sandbox)")
	}
	return c
}

// startDocker runs the Docker watcher of the configuration, if any,
// until the agent stops. A docker section changed by a reload takes
// effect at the agent's next start (dockerReloaded says so). Without a
// docker section, the Docker workloads kept from an earlier run are
// dropped: nothing would keep them current (their containers may go, and
// their addresses go to others).
func (a *Agent) startDocker() {
	c := a.cfg.Docker
	if c == nil {
		a.dropWorkloadsOf(workload.SourceDocker, "no docker section")
		return
	}
	w := docker.New(docker.Options{Socket: c.Socket, Networks: c.Networks, Log: a.log})
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		w.Run(a.ctx, a)
	}()
}

// dockerReloaded warns that a changed docker section waits for a
// restart (the watcher's resync at a restart applies it whole).
func (a *Agent) dockerReloaded(old, cfg *Config) {
	var o, n DockerConfig
	if old.Docker != nil {
		o = *old.Docker
	}
	if cfg.Docker != nil {
		n = *cfg.Docker
	}
	if o.Socket != n.Socket || !slices.Equal(o.Networks, n.Networks) {
		a.log.Warn("the docker section changed: it takes effect at the agent's restart")
	}
}
