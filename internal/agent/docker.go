package agent

import (
	"fmt"
	"slices"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rxlane/rxlane/internal/orchestrator/docker"
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
	// Resync is the period of the full resync while the engine is
	// connected (default docker.DefaultResync; 0: only at each
	// (re)connection).
	Resync time.Duration `json:"resync"`
	Line   int           `json:"line"`
}

// minDockerResync bounds the resync's pace: each one lists the
// engine's containers and networks.
const minDockerResync = time.Second

// sameDocker: the two sections make the same watcher (nil: none).
func sameDocker(a, b *DockerConfig) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Socket == b.Socket && slices.Equal(a.Networks, b.Networks) && a.Resync == b.Resync
}

// docker parses the docker section. It needs a lanes entry that takes
// workloads: without one, the labels could change nothing.
func (d *decoder) docker(n *yaml.Node, path string, ls []LaneConfig) *DockerConfig {
	c := &DockerConfig{Socket: docker.DefaultSocket, Resync: docker.DefaultResync, Line: n.Line}
	if l, ok := d.keyLine[n]; ok {
		c.Line = l
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		// "docker:" alone: the defaults.
	} else {
		f := d.fields(n, path, "socket", "networks", "resync")
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
		if v := f["resync"]; v != nil {
			if z, err := time.ParseDuration(v.Value); v.Kind == yaml.ScalarNode && (v.Value == "0" || err == nil && z == 0) {
				c.Resync = 0
			} else if r, ok := d.duration(v, path+".resync"); ok {
				if r < minDockerResync {
					d.fail(v, path+".resync", "%s: want %s or more (each resync lists the engine's containers), or 0 for none besides the reconnections'", r, minDockerResync)
				}
				c.Resync = r
			}
		}
	}
	if !slices.ContainsFunc(ls, func(l LaneConfig) bool { return l.Workloads }) {
		d.fail(n, path, "no lanes entry takes workloads: add workloads: true to the lane of the namespace where the overlay's VXLAN device is (for Docker's overlay, the network's sandbox)")
	}
	return c
}
