package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// lanesFlags are shared by every lanes verb.
type lanesFlags struct {
	netns       string
	stateDir    string
	json        bool
	agentSocket string
	// opened is the store a verb opened (its Retired note is printed
	// after the verb, whether or not it succeeded)
	opened *lanes.Store
}

// store opens the namespace's lanes store: its rules, its lane record
// and its lock, named by the namespace's identity (every spelling of
// --netns finds the same lane).
func (f *lanesFlags) store() (*lanes.Store, error) {
	st, err := lanes.OpenStore(f.stateDir, f.netns)
	if err != nil {
		return nil, usageError{fmt.Errorf("--netns: %w", err)}
	}
	f.opened = st
	return st, nil
}

// retiredNote says, on stderr, that the verb found and dropped what an
// earlier namespace with this one's inode left in the state directory.
func (f *lanesFlags) retiredNote(w io.Writer) {
	if f.opened != nil && f.opened.Retired {
		fmt.Fprintf(w, "note: %s reuses the inode of a namespace that is gone; that namespace's rules and lane record (%s) were dropped, not applied here\n", f.opened.NS, f.opened.NS.ID())
	}
}

// lanesStateDir is the default state directory: /run/rxlane/lanes, or
// lanes/ under $RXLANE_STATE_DIR (a test, or a second rxlane beside a
// production one, keeps its rules apart without a flag on every verb).
func lanesStateDir() string {
	if d := os.Getenv("RXLANE_STATE_DIR"); d != "" {
		return filepath.Join(d, "lanes")
	}
	return "/run/rxlane/lanes"
}

func newLanesCmd() *cobra.Command {
	f := &lanesFlags{}
	cmd := &cobra.Command{
		Use:   "lanes",
		Short: "Priority lanes: high-priority rules and the BPF fast path on the receiving host",
		Long: `Priority lanes give high-priority overlay flows a run-to-completion path on
the receiving host: a tc ingress program on the underlay device decapsulates
matching VXLAN packets and hands them straight to the container's veth
(PRISM-sync on a stock kernel). Everything else takes the normal path.

On the testbed (rxlane testbed up), for ctrB's UDP port 7000:

  rxlane lanes add --netns rxl-hostB --dst 198.19.0.2 --proto udp --port 7000
  rxlane lanes enable --netns rxl-hostB --skip-netfilter
  rxlane lanes stats --netns rxl-hostB
  rxlane lanes disable --netns rxl-hostB

Rules are kept per namespace: give add the --netns you give enable. enable
prints how many rules the lane holds and every condition of the node that
would send their traffic to the normal path. On the testbed one applies:
bridge netfilter is on on most machines (--skip-netfilter serves the container
anyway, skipping iptables on bridged traffic). On a node whose underlay
cannot verify the tunnel's outer UDP checksums (a veth whose other end
offloads them), enable says so and --trust-outer-csum takes them
unverified. On a Flannel or Calico node
the pods are routed: a pod is served when discovery proves that the node's
forward path (iptables and nftables rules, rp_filter, forwarding, policy
routing) would neither drop nor change what the lane delivers to it, else
enable names the rule or setting and --skip-netfilter serves it anyway,
skipping that (netfilter FORWARD, where Calico enforces NetworkPolicy); on a
Docker overlay network give the network's sandbox namespace:
--netns <exec-root>/netns/1-<id> (/var/run/docker/netns/1-<id> by default;
a dockerd started with --exec-root DIR keeps it in DIR/netns). The
containers behind the sandbox's bridge are read in their own namespaces,
which rxlane finds in /run/netns, /var/run/docker/netns, the exec root of
every running dockerd (its --exec-root, or "exec-root" in its
--config-file) and the directories in $RXLANE_DOCKER_NETNS (colon-separated).

Endpoints are read when the lane is enabled; keep 'rxlane lanes watch'
running to follow pods that start or stop later. Rules can change while
the lane is enabled. While 'rxlane agent' runs and manages the namespace,
add, del and sync go through the agent (its socket) instead, so that it
stays the lane's only writer (docs/agent.md). See docs/lanes.md.`,
	}
	cmd.PersistentFlags().StringVar(&f.netns, "netns", "", "network namespace of the receiving host (name in /run/netns or a path; default: this one)")
	cmd.PersistentFlags().StringVar(&f.stateDir, "state-dir", lanesStateDir(), "where rules and datapath state are kept ($RXLANE_STATE_DIR/lanes when that is set)")
	cmd.PersistentFlags().BoolVar(&f.json, "json", false, "print JSON")
	cmd.PersistentFlags().StringVar(&f.agentSocket, "agent-socket", agentSocket(), "a running agent's socket: add, del and sync go through the agent while it runs and manages the namespace ($RXLANE_AGENT_SOCKET)")
	cmd.AddCommand(newLanesAddCmd(f), newLanesDelCmd(f), newLanesListCmd(f), newLanesEnableCmd(f),
		newLanesDisableCmd(f), newLanesStatsCmd(f), newLanesSyncCmd(f), newLanesWatchCmd(f))
	// every verb says so when its store dropped an earlier namespace's
	// files, also a verb that failed afterwards
	for _, c := range cmd.Commands() {
		if run := c.RunE; run != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error {
				err := run(cmd, args)
				f.retiredNote(cmd.ErrOrStderr())
				return err
			}
		}
	}
	return cmd
}

func newLanesAddCmd(f *lanesFlags) *cobra.Command {
	var s policy.Spec
	cmd := &cobra.Command{
		Use:   "add",
		Short: "Add a high-priority rule (applied at once if the lane is enabled)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := f.store()
			if err != nil {
				return err
			}
			r, err := policy.Parse(s)
			if err != nil {
				return usageError{err}
			}
			rs := &agent.RuleSpec{Dst: s.Dst, Src: s.Src, Proto: s.Proto, Port: s.Port, VNI: s.VNI}
			if ok, err := f.viaAgent(agent.Request{Op: agent.OpLanesAdd, Rule: rs}, &r); ok {
				if err != nil {
					return err
				}
				f.agentNote(cmd, "added as a runtime rule")
			} else {
				r, err = st.AddRule(r)
				if errors.Is(err, policy.ErrInvalid) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
			}
			warning := ruleWarning(st.NS.Path, f.netns, r)
			if f.json {
				return writeJSON(cmd.OutOrStdout(), struct {
					policy.Rule
					Warning string `json:"warning,omitempty"`
				}{r, warning})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rule %d: %s\n", r.ID, r)
			if warning != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "warning: %s\n", warning)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&s.Dst, "dst", "", "inner destination IP or CIDR")
	cmd.Flags().StringVar(&s.Src, "src", "", "inner source IP or CIDR")
	cmd.Flags().StringVar(&s.Proto, "proto", "", "udp, tcp, icmp or any")
	cmd.Flags().StringVar(&s.Port, "port", "", "destination port N or range N-M (udp/tcp)")
	cmd.Flags().StringVar(&s.VNI, "vni", "", "only on this VNI")
	return cmd
}

// agentNote tells a person that the change went through the agent.
func (f *lanesFlags) agentNote(cmd *cobra.Command, what string) {
	if !f.json {
		fmt.Fprintf(cmd.ErrOrStderr(), "(%s by the rxlane agent at %s: see docs/agent.md)\n", what, f.agentSocket)
	}
}

// ruleWarning says what a user who just added r must know about the
// namespace it went to: that it has no VXLAN device (rules are kept per
// namespace: a forgotten --netns), or that no local endpoint matches r yet.
func ruleWarning(nsPath, netnsFlag string, r policy.Rule) string {
	topo, err := overlay.DiscoverIn(nsPath)
	if err != nil {
		return ""
	}
	where := "this namespace"
	if netnsFlag != "" {
		where = "namespace " + netnsFlag
	}
	if len(topo.Tunnels) == 0 {
		return fmt.Sprintf("%s has no VXLAN device: rules are kept per namespace, so rule %d serves only a lane enabled here (did you mean --netns?)", where, r.ID)
	}
	if !lanes.MatchesEndpoint(topo, r) {
		return fmt.Sprintf("rule %d matches no local endpoint yet in %s: its packets take the normal path until a pod with that address is found (lanes enable, sync or watch)", r.ID, where)
	}
	return ""
}

func newLanesDelCmd(f *lanesFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "del ID",
		Short: "Delete a rule by ID",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want exactly one rule ID")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.Atoi(args[0])
			if err != nil {
				return usagef("rule ID %q: not a number", args[0])
			}
			st, err := f.store()
			if err != nil {
				return err
			}
			var r policy.Rule
			if ok, err := f.viaAgent(agent.Request{Op: agent.OpLanesDel, ID: id}, &r); ok {
				if err != nil {
					return err
				}
				f.agentNote(cmd, "deleted")
			} else {
				r, err = st.DelRule(id)
				if errors.Is(err, policy.ErrNoRule) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
			}
			if !f.json {
				fmt.Fprintf(cmd.OutOrStdout(), "deleted rule %d: %s\n", r.ID, r)
				return nil
			}
			return writeJSON(cmd.OutOrStdout(), r)
		},
	}
}

func newLanesListCmd(f *lanesFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the rules",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := f.store()
			if err != nil {
				return err
			}
			set, err := st.Rules()
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), set)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tRULE")
			for _, r := range set.Rules {
				fmt.Fprintf(tw, "%d\t%s\n", r.ID, r)
			}
			return tw.Flush()
		},
	}
}

func newLanesEnableCmd(f *lanesFlags) *cobra.Command {
	var dev, mode string
	var skip, force, trust bool
	cmd := &cobra.Command{
		Use:   "enable",
		Short: "Discover tunnels and endpoints, load the lane and attach it to the underlay",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lanes.ValidMode(mode); err != nil {
				return err
			}
			if err := refuseAgentOwned(f.agentSocket, agent.WhatLanes, f.netns, nsSubject("lane", f.netns)); err != nil {
				return err
			}
			st, err := f.store()
			if err != nil {
				return err
			}
			topo, err := st.Enable(lanes.Options{Device: dev, SkipNetfilter: skip || force, TrustOuterCsum: trust, Mode: mode})
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), topo)
			}
			printTopology(cmd.OutOrStdout(), topo)
			printAdvice(cmd.OutOrStdout(), topo.Advice)
			fmt.Fprintf(cmd.OutOrStdout(), "endpoints were read now: pods that start or stop later are picked up by `rxlane lanes watch%s` (or `rxlane lanes sync`)\n", netnsArg(f.netns))
			return nil
		},
	}
	cmd.Flags().StringVar(&dev, "dev", "", "underlay device to attach to (default: the VXLAN devices' underlay)")
	cmd.Flags().BoolVar(&skip, "skip-netfilter", false, "serve endpoints whose normal path filters traffic, skipping that filter: bridge netfilter, the routed FORWARD chain (where Calico enforces NetworkPolicy), tc egress. A security choice: recorded and shown by stats")
	cmd.Flags().BoolVar(&force, "force", false, "old name of --skip-netfilter")
	cmd.Flags().MarkDeprecated("force", "use --skip-netfilter (the lane skips netfilter, where network policy may be enforced)")
	cmd.Flags().BoolVar(&trust, "trust-outer-csum", false, "take packets with an outer UDP checksum the device did not verify")
	cmd.Flags().StringVar(&mode, "mode", lanes.ModeSync, "lane mode: sync (tc, run to completion) or queue (XDP before GRO/RPS, the container veth's own NAPI ring)")
	return cmd
}

// netnsArg is the --netns flag to repeat in a hint.
func netnsArg(netns string) string {
	if netns == "" {
		return ""
	}
	return " --netns " + netns
}

// printAdvice prints how many rules the lane holds and each warning.
func printAdvice(w io.Writer, a *lanes.Advice) {
	if a == nil {
		return
	}
	fmt.Fprintf(w, "\nrules: %d loaded\n", a.Rules)
	for _, s := range a.Warnings {
		fmt.Fprintf(w, "warning: %s\n", s)
	}
}

func printTopology(w io.Writer, t lanes.Topology) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TUNNEL\tVNI\tPORT\tMODE\tUNDERLAY\tPEERS")
	for _, tn := range t.Tunnels {
		mode := "bridged (" + tn.Bridge + ")"
		if tn.Routed {
			mode = "routed"
		}
		under := tn.Underlay
		if under == "" {
			under = "- (not in this namespace: sync lane on " + tn.Name + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\n", tn.Name, tn.VNI, tn.Port, mode, under, len(tn.Peers))
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nENDPOINT\tVNI\tMAC\tIP\tSERVED")
	for _, e := range t.Endpoints {
		served := "yes"
		if e.Skip != "" && !t.SkipNetfilter {
			served = "no: " + e.Skip + " (--skip-netfilter serves it, skipping that filter)"
		} else if e.Skip != "" {
			served = "yes (skipping netfilter: " + e.Skip + ")"
		}
		ip := "-"
		if e.IP.IsValid() {
			ip = e.IP.String()
		} else if len(e.Addrs) > 0 {
			var as []string
			for _, a := range e.Addrs {
				as = append(as, a.String())
			}
			ip = strings.Join(as, ",")
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", e.Dev, e.VNI, e.MAC, ip, served)
	}
	tw.Flush()
}

func newLanesDisableCmd(f *lanesFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "disable",
		Short: "Detach the lane and undo everything enable changed (rules are kept)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := refuseAgentOwned(f.agentSocket, agent.WhatLanes, f.netns, nsSubject("lane", f.netns)); err != nil {
				return err
			}
			st, err := f.store()
			if err != nil {
				return err
			}
			r, err := st.Disable()
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), r)
			}
			printRemoval(cmd.OutOrStdout(), r, st)
			return nil
		},
	}
}

// printRemoval says what disable found and removed.
func printRemoval(w io.Writer, r lanes.Removal, st *lanes.Store) {
	switch {
	case r.NetnsGone:
		fmt.Fprintf(w, "the recorded namespace no longer exists (its lane went with it): record removed\n")
	case r.Recorded && r.Interrupted:
		fmt.Fprintf(w, "undid an interrupted enable from its record\n")
	case r.Recorded:
		fmt.Fprintf(w, "lane disabled\n")
	}
	if len(r.Unrecorded) > 0 {
		var ds []string
		for _, a := range r.Unrecorded {
			ds = append(ds, a.Device)
		}
		fmt.Fprintf(w, "removed rxlane's lane program from %s, attached without a record in %s (a clsact qdisc rxlane did not mark as its own stays; veth settings of a queue lane cannot be restored without the record)\n", strings.Join(ds, ", "), st.Dir)
	}
	if !r.Recorded && len(r.Unrecorded) == 0 {
		fmt.Fprintf(w, "lanes are not enabled in %s: no record in %s and no rxlane lane program attached\n", st.NS, st.Dir)
	}
}

// yesNo is "no", or yes when on.
func yesNo(on bool, yes string) string {
	if on {
		return yes
	}
	return "no"
}

func newLanesSyncCmd(f *lanesFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "sync",
		Short: "Re-discover endpoints and peers (containers that came or went) into the enabled lane",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := f.store()
			if err != nil {
				return err
			}
			var topo lanes.Topology
			if ok, err := f.viaAgent(agent.Request{Op: agent.OpSync}, &topo); ok {
				if err != nil {
					return err
				}
				f.agentNote(cmd, "synced")
			} else if topo, err = st.Sync(); err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), topo)
			}
			printTopology(cmd.OutOrStdout(), topo)
			printAdvice(cmd.OutOrStdout(), topo.Advice)
			return nil
		},
	}
}

func newLanesWatchCmd(f *lanesFlags) *cobra.Command {
	var settle, every string
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Keep the enabled lane's endpoints current as containers come and go (runs until Ctrl-C)",
		Long: `Listens to link, route and neighbour (bridge FDB) events of the lane's
namespace and re-syncs the lane (as 'rxlane lanes sync' does) at once (2 ms
after the first event, so a container reaches the lane within a sync's
time), at most every 10 ms while events continue, and once more when they
settle (--settle), with the rules of the state file at that moment; in queue mode it also turns on
the NAPI of new containers' veths. Prints one line per sync (--json: one
JSON object per line). Stops on Ctrl-C or SIGTERM, or when the lane is
disabled; the lane itself keeps running either way.

When the namespace file is remade (a new namespace at the same path:
Docker makes an overlay's sandbox <exec-root>/netns/1-<id> anew when
dockerd restarts), the lane went with the old namespace: watch removes its
record and enables the lane again in the new one, with the same mode and
flags, as soon as it has a VXLAN device.

Examples:
  rxlane lanes watch --netns rxl-hostB
  rxlane lanes watch --netns rxl-hostB --every 30s --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := f.store()
			if err != nil {
				return err
			}
			wo := lanes.WatchOptions{}
			if wo.Settle, err = parseDuration("settle", settle); err != nil {
				return err
			}
			if every != "0" {
				if wo.Every, err = parseDuration("every", every); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			report := func(topo lanes.Topology, err error) {
				now := time.Now().Format(time.RFC3339)
				switch {
				case f.json && err != nil:
					writeJSON(out, map[string]any{"time": now, "error": err.Error()})
				case f.json:
					writeJSON(out, map[string]any{"time": now, "topology": topo})
				case err != nil:
					fmt.Fprintf(cmd.ErrOrStderr(), "%s sync failed: %v\n", now, err)
				default:
					fmt.Fprintf(out, "%s synced: %d tunnels, %d endpoints\n", now, len(topo.Tunnels), len(topo.Endpoints))
				}
			}
			err = st.Watch(cmd.Context(), wo, report)
			if errors.Is(err, lanes.ErrNotEnabled) {
				return errors.New("lanes are not enabled (or were disabled): nothing to watch")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&settle, "settle", "200ms", "quiet time after events before the last re-sync of a burst (the first event re-syncs at once)")
	cmd.Flags().StringVar(&every, "every", "30s", "also re-sync this often without events (0: never)")
	return cmd
}

func newLanesStatsCmd(f *lanesFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Show per-lane, per-rule and per-reason counters",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := f.store()
			if err != nil {
				return err
			}
			st, err := store.Stats()
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			w := cmd.OutOrStdout()
			for _, s := range st.Warnings {
				fmt.Fprintf(w, "WARNING: %s\n", s)
			}
			if len(st.Warnings) > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "mode: %s   devices: %s   skip netfilter: %s\n\n", st.Mode, strings.Join(st.Devices, ","), yesNo(st.SkipNetfilter,
				"yes (served endpoints skip bridge netfilter / the FORWARD chain, where network policy may be enforced)"))
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "LANE\tPACKETS\tBYTES\n")
			fmt.Fprintf(tw, "high\t%d\t%d\nlow\t%d\t%d\n", st.High.Packets, st.High.Bytes, st.Low.Packets, st.Low.Bytes)
			fmt.Fprintf(tw, "\nRULE\tPACKETS\tBYTES\tREDIRECT FAILURES\n")
			for _, r := range st.Rules {
				fmt.Fprintf(tw, "%d %s\t%d\t%d\t%d\n", r.ID, r.Rule, r.Packets, r.Bytes, r.RedirectFail)
			}
			fmt.Fprintf(tw, "\nNORMAL PATH BECAUSE\tPACKETS\n")
			for _, name := range lanes.ReasonNames() {
				if n := st.Fallbacks[name]; n > 0 {
					fmt.Fprintf(tw, "%s\t%d\n", name, n)
				}
			}
			return tw.Flush()
		},
	}
}
