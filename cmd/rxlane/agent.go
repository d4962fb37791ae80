package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/metrics"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/workload"
)

func newAgentCmd() *cobra.Command {
	var (
		config, checkConfig, logFormat, logLevel, metricsAddr string
		cleanup, cleanupOnExit                                bool
		cleanupState                                          string
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: own lanes and steering as one YAML config says, keep them current",
		Long: `The node agent reads one YAML config (lanes with their rules, steering), makes
the kernel match it and keeps it current: each lane is enabled and watched
(as 'rxlane lanes watch' does: containers that come and go), steering runs
its closed loop (as 'rxlane steer enable --follow' does). A changed config
(SIGHUP, or the file changing) is validated, then applied: changed rules are
written into the running lanes' maps, nothing is reattached. A config that
does not validate is logged and ignored; the running one stays.

While it runs the agent is the only writer of its lanes: 'rxlane lanes add',
'del' and 'sync' send their change through its root-only socket (they work
directly when no agent runs). On SIGTERM or Ctrl-C it stops and leaves lanes
and steering serving (fail open); --cleanup-on-exit disables them instead.
It tells systemd when it is ready (Type=notify).

Examples:
  rxlane agent --check-config /etc/rxlane/agent.yaml
  rxlane agent --config /etc/rxlane/agent.yaml
  rxlane agent --config /etc/rxlane/agent.yaml --log-format json
  rxlane agent --cleanup --config /etc/rxlane/agent.yaml
  rxlane agent status

See docs/agent.md for the config reference.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if checkConfig != "" {
				if config != "" || cleanup || cleanupOnExit {
					return usagef("--check-config FILE stands alone")
				}
				cfg, err := loadAgentConfig(checkConfig)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: OK (%d lanes, %d steering entries)\n", checkConfig, len(cfg.Lanes), len(cfg.Steering))
				return nil
			}
			if cleanupState != "" {
				if !cleanup || config != "" {
					return usagef("--state-dir goes with --cleanup alone (no --config): it removes what the agent recorded there")
				}
				if !filepath.IsAbs(cleanupState) {
					return usagef("--state-dir %q: want an absolute path", cleanupState)
				}
				log, err := agentLogger(cmd, logFormat, logLevel)
				if err != nil {
					return err
				}
				if err := agent.CleanupState(cleanupState, log); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed every lane, steering entry and isolation recorded in %s, and the agent's state\n", cleanupState)
				return nil
			}
			if config == "" {
				return usagef("--config FILE is required (or --check-config FILE, or --cleanup --state-dir DIR)")
			}
			log, err := agentLogger(cmd, logFormat, logLevel)
			if err != nil {
				return err
			}
			if cleanup {
				if cleanupOnExit {
					return usagef("--cleanup and --cleanup-on-exit: pick one")
				}
				cfg, err := loadAgentConfig(config)
				if err != nil {
					return fmt.Errorf("%w\n(to remove what the agent recorded without a config that loads: rxlane agent --cleanup --state-dir %s)", err, agent.DefaultStateDir)
				}
				if err := agent.Cleanup(cfg, log); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "removed every lane and steering entry of the config and the agent's state")
				return nil
			}
			// The exporter reads the agent's entries at scrape time; the
			// agent reports every reconcile to it.
			var a *agent.Agent
			exp := metrics.New(metrics.Sources{
				Lanes: func() []*lanes.Store { return a.Stores() },
				Steer: func() []metrics.SteerSource {
					var out []metrics.SteerSource
					for _, s := range a.SteerStates() {
						out = append(out, metrics.SteerSource{Netns: metrics.NetnsLabel(s.NS), StateFile: s.StateFile})
					}
					return out
				},
				Isolate:   func() *isolate.System { return a.IsolationSystem() },
				Workloads: func() []workload.Workload { return a.Workloads() },
			})
			a, err = agent.New(agent.Options{ConfigFile: config, Log: log, CleanupOnExit: cleanupOnExit, OnReconcile: exp.ObserveReconcile, OnSync: exp.ObserveSync})
			var ce *agent.ConfigError
			if errors.As(err, &ce) {
				return fmt.Errorf("config %s is not valid:\n%w", config, err)
			}
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			addr := a.Config().MetricsAddress
			if cmd.Flags().Changed("metrics-address") {
				addr = metricsAddr
			}
			served := make(chan error, 1)
			if addr != "off" {
				// Listening before anything else: a busy port fails the
				// start, not a scrape later.
				ln, err := net.Listen("tcp", addr)
				if err != nil {
					return fmt.Errorf("metrics address %s: %w (metrics_address in the config, --metrics-address, or off)", addr, err)
				}
				log.Info("metrics", "address", ln.Addr().String())
				go func() {
					served <- metrics.ServeListener(ctx, ln, exp, func() error {
						if !a.Ready() {
							return errors.New("not every entry of the config is reconciled (see the agent's log)")
						}
						return nil
					})
				}()
			} else {
				close(served)
			}
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			// SIGHUP reloads; the end of ctx (SIGTERM, Ctrl-C) is told to
			// systemd as STOPPING=1 before the agent winds down.
			signals := make(chan struct{})
			go func() {
				defer close(signals)
				for {
					select {
					case <-ctx.Done():
						if err := agent.Notify("STOPPING=1"); err != nil {
							log.Warn("sd_notify", "error", err.Error())
						}
						return
					case <-hup:
						log.Info("SIGHUP: reloading the config")
						a.Reload() // logs its own result
					}
				}
			}()
			err = a.Run(ctx, func() {
				if err := agent.Notify("READY=1"); err != nil {
					log.Warn("sd_notify", "error", err.Error())
				}
			})
			cancel()
			<-signals
			return errors.Join(err, <-served)
		},
	}
	cmd.AddCommand(newAgentStatusCmd())
	cmd.Flags().StringVar(&config, "config", "", "the agent's YAML config")
	cmd.Flags().StringVar(&checkConfig, "check-config", "", "validate this config (fields, rules, namespaces) and exit: prints OK or every problem with its line")
	cmd.Flags().StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.Flags().BoolVar(&cleanup, "cleanup", false, "disable every lane and steering entry the config names (and a lane attached there without a record) and everything recorded in its state_dir, revert its isolation, remove the agent's state, and exit")
	cmd.Flags().StringVar(&cleanupState, "state-dir", "", "with --cleanup instead of --config: remove everything recorded in this state_dir (for a config that no longer loads)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-address", agent.DefaultMetricsAddress, "where /metrics, /healthz and /readyz listen (overrides metrics_address in the config; loopback by default; off: no HTTP)")
	cmd.Flags().BoolVar(&cleanupOnExit, "cleanup-on-exit", false, "on SIGTERM or Ctrl-C disable everything instead of leaving it serving")
	return cmd
}

// loadAgentConfig loads a config with an error that lists its problems.
func loadAgentConfig(file string) (*agent.Config, error) {
	cfg, err := agent.LoadConfig(file)
	var ce *agent.ConfigError
	if errors.As(err, &ce) {
		return nil, fmt.Errorf("config %s is not valid:\n%w", file, err)
	}
	return cfg, err
}

func agentLogger(cmd *cobra.Command, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), o)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// agentSocket is the socket a running agent listens on by default:
// $RXLANE_AGENT_SOCKET, agent.sock under $RXLANE_STATE_DIR when that is
// set (beside the lanes' state it moves), or the config's default.
func agentSocket() string {
	if p := os.Getenv("RXLANE_AGENT_SOCKET"); p != "" {
		return p
	}
	if d := os.Getenv("RXLANE_STATE_DIR"); d != "" {
		return d + "/agent.sock"
	}
	return agent.DefaultSocket
}

// viaAgent sends a lanes change to a running agent, the single writer
// of the lanes it manages. handled is false when no agent runs (no
// socket, or a stale one) or the agent does not manage this namespace:
// the caller then changes the lane directly, as without an agent.
func (f *lanesFlags) viaAgent(req agent.Request, result any) (handled bool, err error) {
	ref, err := netns.Resolve(f.netns)
	if err != nil {
		return false, nil // the direct path names the bad --netns
	}
	c, err := agent.Dial(f.agentSocket)
	if errors.Is(err, agent.ErrNoAgent) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	defer c.Close()
	req.Netns, req.NetnsID = f.netns, ref.ID()
	err = c.Call(req, result)
	var re *agent.RemoteError
	if errors.As(err, &re) {
		switch re.Code {
		case agent.CodeUnmanaged:
			return false, nil
		case agent.CodeInvalid, agent.CodeNoRule, agent.CodeConfigRule:
			return true, usageError{err}
		}
		return true, fmt.Errorf("the agent (%s): %w", f.agentSocket, err)
	}
	return true, err
}

// refuseAgentOwned refuses a change the running agent's config owns: the
// lane or steering (what) of namespace ns, or the node's isolation. The
// agent would undo it or fight it (it re-enables a lane disabled behind
// its back), so there must be one writer: the agent, through its config.
// With no agent, or for what it does not own, it returns nil.
func refuseAgentOwned(socket, what, ns, subject string) error {
	req := agent.Request{Op: agent.OpManages, What: what, Netns: ns}
	if what != agent.WhatIsolation {
		ref, err := netns.Resolve(ns)
		if err != nil {
			return nil // the command itself names the bad --netns
		}
		req.NetnsID = ref.ID()
	}
	c, err := agent.Dial(socket)
	if errors.Is(err, agent.ErrNoAgent) {
		return nil
	}
	if err != nil {
		return err
	}
	defer c.Close()
	var m agent.Manages
	if err := c.Call(req, &m); err != nil {
		return fmt.Errorf("ask the agent at %s who owns %s: %w", socket, subject, err)
	}
	if !m.Managed {
		return nil
	}
	return usagef("%s belongs to the running rxlane agent (%s, %s line %d): change that entry and reload the agent (systemctl reload rxlane-agent), or stop the agent first", subject, m.Entry, m.Config, m.Line)
}

// nsSubject names a namespace's lane or steering in messages.
func nsSubject(what, ns string) string {
	if ns == "" {
		return "the " + what + " of this namespace"
	}
	return fmt.Sprintf("the %s of namespace %q", what, ns)
}

func newAgentStatusCmd() *cobra.Command {
	var socket string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Ask the running agent for its entries, their rules (config or runtime) and errors",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := agent.Dial(socket)
			if errors.Is(err, agent.ErrNoAgent) {
				return fmt.Errorf("no rxlane agent answers on %s", socket)
			}
			if err != nil {
				return err
			}
			defer c.Close()
			var st agent.Status
			if err := c.Call(agent.Request{Op: agent.OpStatus}, &st); err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "config %s, ready: %v\n", st.Config, st.Ready)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "\nLANE\tMODE\tRULE\tSOURCE\tERROR")
			for _, l := range st.Lanes {
				ns := cmp.Or(l.Netns, "(own)")
				if len(l.Rules) == 0 {
					fmt.Fprintf(tw, "%s\t%s\t-\t-\t%s\n", ns, l.Mode, l.Error)
				}
				for _, r := range l.Rules {
					src := r.Source
					if r.Line > 0 {
						src = fmt.Sprintf("config line %d", r.Line)
					}
					if r.Workload != "" {
						src = "workload " + r.Workload
					}
					fmt.Fprintf(tw, "%s\t%s\t%d %s\t%s\t%s\n", ns, l.Mode, r.ID, r.Rule.String(), src, l.Error)
				}
			}
			if len(st.Steering) > 0 {
				fmt.Fprintln(tw, "\nSTEERING\tMODE\tERROR")
				for _, s := range st.Steering {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", cmp.Or(s.Netns, "(own)"), s.Mode, s.Error)
				}
			}
			if len(st.Workloads) > 0 {
				fmt.Fprintln(tw, "\nWORKLOAD\tNAME\tLANE\tADDRESSES\tPORTS\tSERVED")
				for _, wl := range st.Workloads {
					served := "-"
					switch {
					case wl.Served:
						served = "yes"
					case wl.Unserved != "":
						served = "no: " + wl.Unserved
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\n", wl.Key(), cmp.Or(wl.Name, "-"), cmp.Or(wl.Lane, "default"), wl.IPs, cmp.Or(wl.Ports, "all"), served)
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&socket, "socket", agentSocket(), "the agent's socket ($RXLANE_AGENT_SOCKET)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
