// Package workload is what an orchestrator tells rxlane about one
// container: its addresses and the lane it asked for. The CNI plugin, the
// Kubernetes pod watcher and the Docker event watcher each turn their own
// metadata (CNI args, pod annotations, container labels) into a Workload;
// the node agent turns a Workload into high-priority rules of the lanes
// its configuration lets workloads join.
//
// A workload can only ask for a lane for traffic to its own addresses:
// what a lane may skip on the node (netfilter, policy) is the operator's
// agent configuration alone, never the workload's.
package workload

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/rxlane/rxlane/internal/policy"
)

// Lanes a workload may ask for.
const (
	// LaneHigh: the high-priority lane (rules for the workload's
	// addresses and ports).
	LaneHigh = "high"
	// LaneDefault: no lane, the normal path ("" means the same).
	LaneDefault = "default"
)

// Sources of a workload.
const (
	SourceCNI        = "cni"
	SourceKubernetes = "kubernetes"
	SourceDocker     = "docker"
)

// Kubernetes pod annotations and Docker container labels read by the
// watchers and the CNI plugin.
const (
	AnnotationLane  = "rxlane.io/lane"
	AnnotationPorts = "rxlane.io/ports"
	AnnotationProto = "rxlane.io/proto"
	LabelLane       = "rxlane.lane"
	LabelPorts      = "rxlane.ports"
	LabelProto      = "rxlane.proto"
)

// MaxPortRanges bounds the ports a workload lists: each range of each
// address is one of a lane's 64 rules.
const MaxPortRanges = 8

// ErrInvalid marks a workload whose lane request cannot be parsed.
var ErrInvalid = errors.New("invalid workload")

// Workload is one container and its lane request.
type Workload struct {
	// Source and ID identify it: (cni, container ID), (kubernetes, pod
	// UID), (docker, container ID).
	Source string `json:"source"`
	ID     string `json:"id"`
	// Name is for people: namespace/pod or the container's name.
	Name string       `json:"name,omitempty"`
	IPs  []netip.Addr `json:"ips"`
	// Lane is LaneHigh or LaneDefault/"" (no rules).
	Lane string `json:"lane,omitempty"`
	// Ports are destination ports, "N" or "N-M", comma separated ("":
	// every port); Proto is udp, tcp or any ("": any).
	Ports string `json:"ports,omitempty"`
	Proto string `json:"proto,omitempty"`
}

// Key identifies the workload among every source's.
func (w Workload) Key() string { return w.Source + "/" + w.ID }

func (w Workload) String() string {
	if w.Name != "" {
		return fmt.Sprintf("%s %s (%s)", w.Source, w.Name, shortID(w.ID))
	}
	return fmt.Sprintf("%s %s", w.Source, shortID(w.ID))
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Validate checks the workload's identity and lane request.
func (w Workload) Validate() error {
	switch w.Source {
	case SourceCNI, SourceKubernetes, SourceDocker:
	default:
		return invalid("source %q: want %s, %s or %s", w.Source, SourceCNI, SourceKubernetes, SourceDocker)
	}
	if w.ID == "" {
		return invalid("no ID")
	}
	_, err := w.Rules()
	return err
}

// InLane reports whether the workload asked for the high-priority lane.
func (w Workload) InLane() bool { return strings.EqualFold(strings.TrimSpace(w.Lane), LaneHigh) }

// Rules are the high-priority rules the workload asks for: one per
// address and port range (IDs 0: a lane's store assigns them). A workload
// in the default lane, or without addresses, asks for none.
func (w Workload) Rules() ([]policy.Rule, error) {
	switch l := strings.ToLower(strings.TrimSpace(w.Lane)); l {
	case LaneHigh:
	case "", LaneDefault:
		if w.Ports != "" || w.Proto != "" {
			// Ports without a lane are most likely a forgotten lane:
			// say so rather than ignore them.
			return nil, invalid("ports or proto given without lane %q", LaneHigh)
		}
		return nil, nil
	default:
		return nil, invalid("lane %q: want %s or %s", w.Lane, LaneHigh, LaneDefault)
	}
	proto := strings.ToLower(strings.TrimSpace(w.Proto))
	switch proto {
	case policy.ProtoAny, "any", policy.ProtoUDP, policy.ProtoTCP:
	default:
		return nil, invalid("proto %q: want udp, tcp or any", w.Proto)
	}
	var ports []string
	if strings.TrimSpace(w.Ports) != "" {
		for p := range strings.SplitSeq(w.Ports, ",") {
			if p = strings.TrimSpace(p); p == "" {
				return nil, invalid("ports %q: empty item", w.Ports)
			}
			ports = append(ports, p)
		}
		if len(ports) > MaxPortRanges {
			return nil, invalid("ports %q: %d ranges, at most %d", w.Ports, len(ports), MaxPortRanges)
		}
	} else {
		ports = []string{""}
	}
	var out []policy.Rule
	seen := map[netip.Addr]bool{}
	for _, ip := range w.IPs {
		ip = ip.Unmap()
		if !ip.IsValid() || ip.Zone() != "" {
			return nil, invalid("address %q", ip)
		}
		if seen[ip] {
			continue
		}
		seen[ip] = true
		for _, p := range ports {
			r, err := policy.Parse(policy.Spec{Dst: ip.String(), Proto: proto, Port: p})
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
			}
			out = append(out, r)
		}
	}
	for i, a := range out {
		for _, b := range out[i+1:] {
			if policy.Overlaps(a, b) {
				return nil, invalid("ports %q: ranges %s and %s overlap", w.Ports, a, b)
			}
		}
	}
	return out, nil
}

// FromMetadata reads a lane request from annotations or labels, with the
// three keys given (lane, ports, proto). Keys that are absent leave the
// workload in the default lane.
func FromMetadata(m map[string]string, laneKey, portsKey, protoKey string) (lane, ports, proto string) {
	return strings.TrimSpace(m[laneKey]), strings.TrimSpace(m[portsKey]), strings.TrimSpace(m[protoKey])
}

// Overlapping returns the keys of the workloads in others whose rules
// match packets of w's (an address reused by a new container before the
// old one's removal arrived).
func Overlapping(w Workload, others map[string]Workload) []string {
	mine, err := w.Rules()
	if err != nil || len(mine) == 0 {
		return nil
	}
	var keys []string
	for k, o := range others {
		if k == w.Key() {
			continue
		}
		theirs, err := o.Rules()
		if err != nil {
			continue
		}
		if slices.ContainsFunc(theirs, func(t policy.Rule) bool {
			return slices.ContainsFunc(mine, func(m policy.Rule) bool { return policy.Overlaps(m, t) })
		}) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
