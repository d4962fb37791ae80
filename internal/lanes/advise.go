package lanes

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// Advice says what stands between the lane's rules and the lane: every
// condition of the node that sends a rule's traffic to the normal path,
// found when the lane is enabled or synced. A lane that serves nobody
// fails silently otherwise (every packet still arrives, by the normal
// path), so Enable and Sync return it and the CLI prints it.
type Advice struct {
	// Rules is how many rules the lane holds.
	Rules int `json:"rules"`
	// Warnings are conditions that send traffic a rule matches to the
	// normal path, or make the lane wait where it should not; each is one
	// sentence that names the fix.
	Warnings []string `json:"warnings"`
}

// underlayFacts are what the datapath cannot see from BPF about an
// underlay: whether it verifies outer UDP checksums, and whether RPS
// queues its packets in a backlog before tc ingress.
type underlayFacts struct {
	veth   bool
	rxCsum bool
	// A veth verifies nothing itself: its packets arrive as the other
	// end sent them. With tx checksum offload on there (peerTxCsum) they
	// arrive CHECKSUM_PARTIAL, checksums never computed, which BPF cannot
	// tell from unverified ones; computed in software, GRO on this end
	// verifies them as a NIC would (gro).
	peerTxCsum, gro bool
	peer            string   // the other end's name, when found
	rps             []string // "rx-0: 2", queues with a non-empty RPS mask
}

// csumUnverified says why a tunnel's outer UDP checksums reach the lane
// unverified on this underlay, or "" when the device verifies them.
func (f underlayFacts) csumUnverified(dev string) string {
	switch {
	case f.veth && f.peerTxCsum:
		return dev + " is a veth whose other end (" + cmp.Or(f.peer, "?") + ") has tx checksum offload on (the checksums are never computed; `ethtool -K " + cmp.Or(f.peer, "<other end>") + " tx off` computes them)"
	case f.veth && !f.gro:
		return dev + " is a veth with GRO off (nothing verifies the checksums; GRO on verifies them)"
	case !f.veth && !f.rxCsum:
		return dev + " has rx-checksumming off"
	}
	return ""
}

// readUnderlays reads the facts of the tunnels' underlays in a namespace
// (sysfs of that namespace for RPS). Advice never fails an enable: a
// namespace it cannot enter gives no facts and the error, which advise
// turns into a warning (an unread fact must not look like a clean node).
func readUnderlays(nsPath string, topo overlay.Topology) (map[string]underlayFacts, error) {
	out := map[string]underlayFacts{}
	err := netns.Do(nsPath, true, func() error {
		for _, tn := range topo.Tunnels {
			if tn.Underlay == "" {
				continue
			}
			if _, ok := out[tn.Underlay]; ok {
				continue
			}
			var f underlayFacts
			if l, err := netlink.LinkByName(tn.Underlay); err == nil {
				f.veth = l.Type() == "veth"
				if f.veth {
					f.gro, _ = ethtool.Get(tn.Underlay, ethtool.GRO)
					f.peerTxCsum = true // unless read otherwise below
					if ns, peer, err := overlay.VethPeer(l); err == nil {
						f.peer = peer.Attrs().Name
						inNetns(ns, func() (err error) {
							f.peerTxCsum, err = ethtool.Get(peer.Attrs().Name, ethtool.TxCsum)
							return err
						})
					}
				}
			}
			f.rxCsum, _ = ethtool.Get(tn.Underlay, ethtool.RxCsum)
			qs, _ := filepath.Glob(filepath.Join("/sys/class/net", tn.Underlay, "queues/rx-*/rps_cpus"))
			for _, q := range qs {
				b, err := os.ReadFile(q)
				if err != nil {
					continue
				}
				mask := strings.TrimSpace(string(b))
				if strings.Trim(mask, "0,") != "" {
					f.rps = append(f.rps, filepath.Base(filepath.Dir(q))+": "+mask)
				}
			}
			out[tn.Underlay] = f
		}
		return nil
	})
	return out, err
}

// advise finds the conditions. skip and trust are the lane's --skip-netfilter
// and --trust-outer-csum, mode its mode.
func advise(topo overlay.Topology, rules *policy.Set, under map[string]underlayFacts, underErr error, skip, trust bool, mode string) Advice {
	a := Advice{Rules: len(rules.Rules), Warnings: []string{}}
	warn := func(format string, args ...any) { a.Warnings = append(a.Warnings, fmt.Sprintf(format, args...)) }
	if underErr != nil {
		warn("could not read the underlays' checksum, GRO and RPS settings (%v): conditions that depend on them are not checked", underErr)
	}
	if len(rules.Rules) == 0 {
		warn("the lane holds no rule: every packet takes the normal path (rules are kept per namespace: add them with the same --netns as enable)")
	}
	for _, r := range rules.Rules {
		var matched, served []overlay.Endpoint
		for _, e := range topo.Endpoints {
			if !ruleMatches(r, e) {
				continue
			}
			matched = append(matched, e)
			if e.Skip == "" || skip {
				served = append(served, e)
			}
		}
		switch {
		case len(matched) == 0:
			warn("rule %d matches no local endpoint yet: its packets take the normal path (counted no_endpoint) until a pod with that address is found by `rxlane lanes watch` or `lanes sync`", r.ID)
		case len(served) == 0:
			var why []string
			for _, e := range matched {
				if !slices.Contains(why, e.Skip) {
					why = append(why, e.Skip)
				}
			}
			warn("rule %d: its endpoints are not served (%s): its packets take the normal path (no_endpoint); --skip-netfilter serves them anyway (skipping that filter: where it enforces policy, the lane bypasses it)", r.ID, strings.Join(why, "; "))
		}
	}
	warned := map[string]bool{}
	for _, tn := range topo.Tunnels {
		if tn.Underlay == "" && !tn.Routed {
			warn("%s has no underlay in this namespace (Docker's overlay sandbox): the lane runs on %s itself, after the kernel's decap and gro_cells queue, which high-priority packets share with the flood; it skips only the bridge and the backlog", tn.Name, tn.Name)
		}
		f, ok := under[tn.Underlay]
		if !ok {
			continue
		}
		if mode == ModeQueue && tn.OuterCsum && !trust && !warned["xdpcsum"] {
			warned["xdpcsum"] = true
			warn("%s sends outer UDP checksums and XDP cannot see whether the device verified them: in queue mode every packet goes to the normal path (outer_csum) unless --trust-outer-csum", tn.Name)
		}
		if mode == ModeQueue && f.veth && !warned["xdpveth "+tn.Underlay] {
			warned["xdpveth "+tn.Underlay] = true
			warn("%s is a veth: XDP there copies every packet before the program runs (veth_convert_skb_to_xdp_buff), which a NIC does not; measured on the testbed: 1.15-1.17x receive CPU per flood packet and a worse p99 than vanilla (docs/lanes.md); the sync lane does not pay this", tn.Underlay)
		}
		if why := f.csumUnverified(tn.Underlay); mode != ModeQueue && tn.OuterCsum && !trust && why != "" && !warned["csum "+tn.Underlay] {
			warned["csum "+tn.Underlay] = true
			warn("%s sends outer UDP checksums and %s: if its peers send them too, every packet goes to the normal path (outer_csum); --trust-outer-csum takes them unverified", tn.Name, why)
		}
		if len(f.rps) > 0 && mode != ModeQueue && !warned["rps "+tn.Underlay] {
			warned["rps "+tn.Underlay] = true
			warn("RPS is on for %s (%s): each packet waits in a CPU's backlog queue, behind the flood, before tc ingress runs the sync lane; --mode queue decides before RPS", tn.Underlay, strings.Join(f.rps, ", "))
		}
	}
	return a
}

// MatchesEndpoint says whether a packet rule r matches can be addressed
// to one of topo's endpoints (served or not).
func MatchesEndpoint(topo overlay.Topology, r policy.Rule) bool {
	return slices.ContainsFunc(topo.Endpoints, func(e overlay.Endpoint) bool { return ruleMatches(r, e) })
}

func ruleMatches(r policy.Rule, e overlay.Endpoint) bool {
	return (r.VNI == 0 || r.VNI == e.VNI) && (!r.Dst.IsValid() || endpointIn(e, r.Dst))
}

// endpointIn says whether one of e's addresses is in p; an endpoint
// known only by its MAC (a bridge FDB entry) may be.
func endpointIn(e overlay.Endpoint, p netip.Prefix) bool {
	if !e.IP.IsValid() && len(e.Addrs) == 0 {
		return true
	}
	if e.IP.IsValid() && p.Contains(e.IP) {
		return true
	}
	for _, a := range e.Addrs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
