// Package cni is rxlane-cni, a chained ("meta") CNI plugin: placed after
// the plugins that make a container's interface and give it addresses
// (bridge + host-local, flannel, ...), it passes their result through
// unchanged and tells the rxlane node agent, over the agent's socket, the
// lane the container asks for (runtime config, the pod's annotations when
// the runtime passes them, or CNI_ARGS). When no agent answers, the
// container still starts: the plugin leaves a pending record the agent
// applies when it runs.
//
// A container can only ask for a lane for its own addresses; what a lane
// may skip on the node is the agent's configuration alone.
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/workload"
)

// Defaults of the plugin's configuration: the agent's.
const (
	DefaultSocket   = agent.DefaultSocket
	DefaultStateDir = agent.DefaultStateDir
)

// Capability names the plugin declares in a conflist ("capabilities"):
// the runtime then passes their values in runtimeConfig.
const (
	// CapabilityLane is rxlane's own: runtimeConfig.rxlane = {"lane":
	// "high", "ports": "5201,8080-8090", "proto": "udp"}.
	CapabilityLane = "rxlane"
	// CapabilityPodAnnotations is the pod's annotations, as containerd
	// and CRI-O pass them to plugins that declare it.
	CapabilityPodAnnotations = "io.kubernetes.cri.pod-annotations"
)

// CNI_ARGS keys the plugin reads (others are ignored).
const (
	ArgPodNamespace = "K8S_POD_NAMESPACE"
	ArgPodName      = "K8S_POD_NAME"
	ArgPodUID       = "K8S_POD_UID"
	ArgLane         = "RXLANE_LANE"
	ArgPorts        = "RXLANE_PORTS"
	ArgProto        = "RXLANE_PROTO"
)

// Plugin-specific error codes (the CNI spec leaves 100 and up to
// plugins). The well-known ones used: 4 (types.ErrInvalidEnvironment-
// Variables: malformed CNI_ARGS), 6 (types.ErrDecodingFailure: the
// configuration or its prevResult is not JSON of the right shape), 7
// (types.ErrInvalidNetworkConfig: a field's value is wrong, or CHECK
// without prevResult).
const (
	// ErrInvalidLaneRequest: the container asks for a lane that cannot
	// be given (unknown lane, bad ports or proto, too many ranges):
	// ADD fails, the operator asked for something impossible.
	ErrInvalidLaneRequest uint = 100
	// ErrNoAddresses: the container asks for a lane but prevResult
	// gives it no address (rxlane-cni is chained before the plugin that
	// assigns addresses).
	ErrNoAddresses uint = 101
	// ErrNotRegistered: CHECK found a running agent that holds no lane
	// request for the container's addresses.
	ErrNotRegistered uint = 102
)

// LaneRequest is what a container asks for: a lane, destination ports
// and protocol (workload.Workload's fields).
type LaneRequest struct {
	Lane  string `json:"lane,omitempty"`
	Ports string `json:"ports,omitempty"`
	Proto string `json:"proto,omitempty"`
}

// Empty reports whether nothing was asked.
func (r LaneRequest) Empty() bool { return r.Lane == "" && r.Ports == "" && r.Proto == "" }

// NetConf is the plugin's configuration, as the runtime passes it on
// stdin (one entry of a conflist, with name, cniVersion, prevResult and
// runtimeConfig filled in).
type NetConf struct {
	types.PluginConf
	// Socket is the agent's socket (default DefaultSocket).
	Socket string `json:"socket,omitempty"`
	// StateDir is the agent's state directory (default
	// DefaultStateDir): pending records go to STATE_DIR/agent/pending.
	StateDir string `json:"stateDir,omitempty"`
	// RuntimeConfig holds the capability arguments.
	RuntimeConfig struct {
		Lane           json.RawMessage   `json:"rxlane,omitempty"`
		PodAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	// Result is prevResult as a current (1.0.0) result, nil without
	// one.
	Result *types100.Result `json:"-"`
}

// PendingDir is where the plugin leaves records while no agent answers
// (workload.PendingDir of the agent's state directory).
func (c *NetConf) PendingDir() string {
	return workload.PendingDir(filepath.Join(c.StateDir, "agent"))
}

func cniError(code uint, format string, args ...any) *types.Error {
	return types.NewError(code, fmt.Sprintf(format, args...), "")
}

// ParseConfig decodes and checks the plugin's configuration and its
// prevResult. Errors are *types.Error with the codes above.
func ParseConfig(stdin []byte) (*NetConf, error) {
	c := &NetConf{}
	if err := json.Unmarshal(stdin, c); err != nil {
		return nil, cniError(types.ErrDecodingFailure, "rxlane-cni: decode configuration: %v", err)
	}
	if c.CNIVersion == "" {
		// The spec's default; skel's version check treats it so.
		c.CNIVersion = "0.1.0"
	}
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	for _, f := range []struct{ name, v string }{{"socket", c.Socket}, {"stateDir", c.StateDir}} {
		if !filepath.IsAbs(f.v) {
			return nil, cniError(types.ErrInvalidNetworkConfig, "rxlane-cni: %s %q: want an absolute path", f.name, f.v)
		}
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, cniError(types.ErrDecodingFailure, "rxlane-cni: decode prevResult: %v", err)
		}
		r, err := types100.NewResultFromResult(c.PrevResult)
		if err != nil {
			return nil, cniError(types.ErrDecodingFailure, "rxlane-cni: convert prevResult: %v", err)
		}
		c.Result = r
	}
	return c, nil
}

// Args are the CNI_ARGS the plugin reads.
type Args struct {
	PodNamespace, PodName, PodUID string
	Lane                          LaneRequest
}

// ParseArgs reads CNI_ARGS ("K=V;K=V"); unknown keys are ignored, as
// with IgnoreUnknown. A pair without "=" is a *types.Error with code 4.
func ParseArgs(s string) (Args, error) {
	var a Args
	if strings.TrimSpace(s) == "" {
		return a, nil
	}
	for pair := range strings.SplitSeq(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return Args{}, cniError(types.ErrInvalidEnvironmentVariables, "rxlane-cni: CNI_ARGS %q: item %q is not KEY=VALUE", s, pair)
		}
		switch k {
		case ArgPodNamespace:
			a.PodNamespace = v
		case ArgPodName:
			a.PodName = v
		case ArgPodUID:
			a.PodUID = v
		case ArgLane:
			a.Lane.Lane = v
		case ArgPorts:
			a.Lane.Ports = v
		case ArgProto:
			a.Lane.Proto = v
		}
	}
	return a, nil
}

// Request is the container's lane request and where it came from: the
// first of runtimeConfig.rxlane, the pod's annotations (rxlane.io/lane,
// rxlane.io/ports, rxlane.io/proto) and CNI_ARGS (RXLANE_LANE, ...) that
// says anything. An empty request (none of them does) means the default
// lane: nothing to tell the agent.
func Request(c *NetConf, a Args) (LaneRequest, string, error) {
	if raw := c.RuntimeConfig.Lane; len(raw) > 0 && string(raw) != "null" {
		var r LaneRequest
		d := json.NewDecoder(strings.NewReader(string(raw)))
		d.DisallowUnknownFields()
		if err := d.Decode(&r); err != nil {
			return LaneRequest{}, "", cniError(ErrInvalidLaneRequest, "rxlane-cni: runtimeConfig.%s %s: %v (want {\"lane\": \"high\", \"ports\": \"N,N-M\", \"proto\": \"udp|tcp|any\"})", CapabilityLane, raw, err)
		}
		if !r.Empty() {
			return trimmed(r), "runtimeConfig." + CapabilityLane, nil
		}
	}
	if m := c.RuntimeConfig.PodAnnotations; m != nil {
		var r LaneRequest
		r.Lane, r.Ports, r.Proto = workload.FromMetadata(m, workload.AnnotationLane, workload.AnnotationPorts, workload.AnnotationProto)
		if !r.Empty() {
			return r, "pod annotations", nil
		}
	}
	if !a.Lane.Empty() {
		return trimmed(a.Lane), "CNI_ARGS", nil
	}
	return LaneRequest{}, "", nil
}

func trimmed(r LaneRequest) LaneRequest {
	return LaneRequest{strings.TrimSpace(r.Lane), strings.TrimSpace(r.Ports), strings.TrimSpace(r.Proto)}
}

// ContainerAddrs are the addresses prevResult gives the container: those
// of the container's interfaces (an interface with a sandbox) and those
// not tied to an interface; a host-side interface's addresses (a bridge
// gateway) are not the container's. It also returns the container's
// interface named ifName and its sandbox, for logs.
func ContainerAddrs(r *types100.Result, ifName string) (addrs []netip.Addr, iface, sandbox string) {
	if r == nil {
		return nil, "", ""
	}
	for _, i := range r.Interfaces {
		if i != nil && i.Sandbox != "" && (iface == "" || i.Name == ifName) {
			iface, sandbox = i.Name, i.Sandbox
		}
	}
	seen := map[netip.Addr]bool{}
	for _, ip := range r.IPs {
		if ip == nil {
			continue
		}
		if ip.Interface != nil {
			n := *ip.Interface
			if n < 0 || n >= len(r.Interfaces) || r.Interfaces[n] == nil || r.Interfaces[n].Sandbox == "" {
				continue
			}
		}
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		if !seen[a] {
			seen[a] = true
			addrs = append(addrs, a)
		}
	}
	return addrs, iface, sandbox
}

// WorkloadID is the workload's ID for a container's attachment: the
// container ID and the interface (a container on two networks that both
// chain rxlane-cni is two attachments, each removed by its own DEL).
func WorkloadID(containerID, ifName string) string {
	if ifName == "" {
		return containerID
	}
	return containerID + "/" + ifName
}

// asCNIError returns err as a *types.Error (code 999 if it is not one).
func asCNIError(err error) *types.Error {
	var e *types.Error
	if errors.As(err, &e) {
		return e
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}
