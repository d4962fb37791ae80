// Package docker watches a Docker engine and turns the rxlane labels of
// its containers (rxlane.lane, rxlane.ports, rxlane.proto) into the node
// agent's workloads: the container's addresses on the overlay networks
// it joins and the lane it asked for.
//
// It speaks the Engine API as plain HTTP over the daemon's Unix socket
// (the few calls it needs do not justify the Engine's Go module and its
// dependencies): /version to check the daemon answers, /containers/json
// and /networks for a full resync, /containers/{id}/json for one
// container, and /events streamed for changes. A daemon that restarts
// ends the event stream: the watcher reconnects with a backoff and
// resyncs fully, removing the workloads of containers that went while it
// was away. While connected it also resyncs every Options.Resync, which
// corrects what no event said.
package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultSocket is the Engine API's usual socket.
const DefaultSocket = "/var/run/docker.sock"

// ErrNotFound is returned for a container the daemon does not know (gone
// since the event that named it).
var ErrNotFound = errors.New("no such container")

// Client calls the Engine API on a Unix socket.
type Client struct {
	Socket string
	http   *http.Client
}

// NewClient returns a client of the daemon listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		// One daemon, a few calls at a time.
		MaxIdleConns:    2,
		IdleConnTimeout: 30 * time.Second,
	}
	// No client timeout: the event stream lasts as long as the daemon;
	// every call is bounded by its context instead.
	return &Client{Socket: socket, http: &http.Client{Transport: tr}}
}

// Version is the part of /version the watcher logs.
type Version struct {
	Version    string `json:"Version"`
	APIVersion string `json:"ApiVersion"`
}

// EndpointSettings is a container's attachment to one network.
type EndpointSettings struct {
	NetworkID         string `json:"NetworkID"`
	IPAddress         string `json:"IPAddress"`
	GlobalIPv6Address string `json:"GlobalIPv6Address"`
}

// Container is what the watcher reads of a container, from a list
// (/containers/json) or an inspect (/containers/{id}/json): the two
// spell some fields differently, and both are read into this.
type Container struct {
	ID      string
	Name    string // without the leading "/"
	Labels  map[string]string
	Running bool
	// Networks are the container's attachments by network name.
	Networks map[string]EndpointSettings
}

// Network is one of the daemon's networks.
type Network struct {
	ID     string `json:"Id"`
	Name   string `json:"Name"`
	Driver string `json:"Driver"`
}

// Event is one event of the stream.
type Event struct {
	Type   string `json:"Type"`
	Action string `json:"Action"`
	Actor  struct {
		ID         string            `json:"ID"`
		Attributes map[string]string `json:"Attributes"`
	} `json:"Actor"`
}

// ContainerID is the container an event is about: the actor of a
// container event, the "container" attribute of a network's connect or
// disconnect.
func (e Event) ContainerID() string {
	if e.Type == "network" {
		return e.Actor.Attributes["container"]
	}
	return e.Actor.ID
}

// get calls path and decodes its JSON answer into out.
func (c *Client) get(ctx context.Context, path string, out any) error {
	resp, err := c.do(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("docker %s: decode: %w", path, err)
	}
	return nil
}

func (c *Client) do(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("docker %s: %w", c.Socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var m struct{ Message string }
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &m) == nil && m.Message != "" {
			msg = m.Message
		}
		if resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, msg)
		}
		return nil, fmt.Errorf("docker %s: %s: %s", path, resp.Status, msg)
	}
	return resp, nil
}

// Version asks the daemon's version (and whether it answers at all).
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	err := c.get(ctx, "/version", &v)
	return v, err
}

// Containers lists the running containers.
func (c *Client) Containers(ctx context.Context) ([]Container, error) {
	var raw []struct {
		ID              string `json:"Id"`
		Names           []string
		Labels          map[string]string
		State           string
		NetworkSettings struct {
			Networks map[string]EndpointSettings
		}
	}
	if err := c.get(ctx, "/containers/json", &raw); err != nil {
		return nil, err
	}
	out := make([]Container, 0, len(raw))
	for _, r := range raw {
		name := ""
		if len(r.Names) > 0 {
			name = strings.TrimPrefix(r.Names[0], "/")
		}
		out = append(out, Container{ID: r.ID, Name: name, Labels: r.Labels, Running: r.State == "running", Networks: r.NetworkSettings.Networks})
	}
	return out, nil
}

// Inspect reads one container; ErrNotFound when it is gone.
func (c *Client) Inspect(ctx context.Context, id string) (Container, error) {
	var r struct {
		ID     string `json:"Id"`
		Name   string
		Config struct{ Labels map[string]string }
		State  struct{ Running bool }
		// NetworkSettings.Networks as in the list.
		NetworkSettings struct {
			Networks map[string]EndpointSettings
		}
	}
	if err := c.get(ctx, "/containers/"+url.PathEscape(id)+"/json", &r); err != nil {
		return Container{}, err
	}
	return Container{ID: r.ID, Name: strings.TrimPrefix(r.Name, "/"), Labels: r.Config.Labels, Running: r.State.Running, Networks: r.NetworkSettings.Networks}, nil
}

// Networks lists the daemon's networks.
func (c *Client) Networks(ctx context.Context) ([]Network, error) {
	var out []Network
	err := c.get(ctx, "/networks", &out)
	return out, err
}

// eventFilter asks for what changes a container's workload: it starts
// or stops, goes, or joins or leaves a network.
const eventFilter = `{"type":["container","network"],"event":["start","die","destroy","connect","disconnect"]}`

// Events opens the event stream; opened is called once the daemon has
// accepted it (events from then on are delivered), then fn gets each
// event until the stream ends (the daemon stopped: an error) or ctx
// does (nil).
func (c *Client) Events(ctx context.Context, opened func() error, fn func(Event)) error {
	resp, err := c.do(ctx, "/events?filters="+url.QueryEscape(eventFilter))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Ending ctx must end a read blocked on a quiet stream.
	stop := context.AfterFunc(ctx, func() { resp.Body.Close() })
	defer stop()
	if err := opened(); err != nil {
		return err
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var e Event
		if err := dec.Decode(&e); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return errors.New("docker event stream ended (daemon stopped?)")
			}
			return fmt.Errorf("docker event stream: %w", err)
		}
		fn(e)
	}
}
