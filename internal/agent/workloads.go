package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/workload"
)

// Workloads: the orchestrators' lane requests (the CNI plugin through the
// socket or its pending records, the pod and container watchers in the
// agent). Each becomes rules for the workload's own addresses in every
// lane whose entry says `workloads: true`. The configuration's rules and
// the socket's runtime rules win over a workload's that overlap them (the
// workload's are left out, with a warning); a workload whose addresses a
// newer one reuses (a container gone whose removal has not arrived yet)
// is replaced by the newer one.

const workloadsFile = "workloads.json"

// SetWorkload adds or replaces a workload's lane request and applies it
// to the lanes that take workloads. A request that would overfill a lane
// is undone and refused.
func (a *Agent) SetWorkload(w workload.Workload) error {
	if err := w.Validate(); err != nil {
		return &RemoteError{Code: CodeInvalid, Msg: err.Error()}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	prev, had := a.workloads[w.Key()]
	if had && sameWorkload(prev, w) && len(workload.Overlapping(w, a.workloads)) == 0 {
		// Held as it is (a watcher's resync, a CNI ADD repeated):
		// nothing to reconcile, nothing to save. Lanes are not synced
		// when the set of workloads is equal.
		return nil
	}
	replaced := map[string]workload.Workload{}
	for _, k := range workload.Overlapping(w, a.workloads) {
		replaced[k] = a.workloads[k]
		delete(a.workloads, k)
		a.log.Warn("workload replaced: a newer one uses its addresses", "old", replaced[k].String(), "new", w.String())
	}
	a.workloads[w.Key()] = w
	if err := a.applyWorkloads(); err != nil {
		// Back to what was: the lanes must not keep half a request.
		delete(a.workloads, w.Key())
		if had {
			a.workloads[w.Key()] = prev
		}
		for k, o := range replaced {
			a.workloads[k] = o
		}
		if rerr := a.applyWorkloads(); rerr != nil {
			a.log.Error("workload: undo failed", "workload", w.String(), "error", rerr.Error())
		}
		return fmt.Errorf("workload %s: %w", w, err)
	}
	if err := a.saveWorkloads(); err != nil {
		return fmt.Errorf("workload %s applied, but not saved for the agent's restart: %w", w, err)
	}
	a.log.Info("workload set", "workload", w.String(), "lane", w.Lane, "ips", fmt.Sprint(w.IPs), "ports", w.Ports)
	return nil
}

// sameWorkload: a and b (same key) ask for the same thing.
func sameWorkload(a, b workload.Workload) bool {
	return a.Name == b.Name && slices.Equal(a.IPs, b.IPs) && a.Lane == b.Lane && a.Ports == b.Ports && a.Proto == b.Proto
}

// RemoveWorkload drops a workload's lane request (nothing to do if the
// agent does not know it: a DEL may come twice, or for a container that
// never asked for a lane).
func (a *Agent) RemoveWorkload(source, id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := workload.Workload{Source: source, ID: id}.Key()
	w, ok := a.workloads[key]
	if !ok {
		return nil
	}
	delete(a.workloads, key)
	if err := a.saveWorkloads(); err != nil {
		return fmt.Errorf("workload %s: %w", w, err)
	}
	if err := a.applyWorkloads(); err != nil {
		return fmt.Errorf("workload %s removed, but a lane did not follow: %w", w, err)
	}
	a.log.Info("workload removed", "workload", w.String())
	return nil
}

// Workloads are the workloads the agent knows, by key order.
func (a *Agent) Workloads() []workload.Workload {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]workload.Workload, 0, len(a.workloads))
	for _, w := range a.workloads {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// WorkloadsOf returns the workloads of one source (a watcher's resync
// compares them with what its orchestrator still runs).
func (a *Agent) WorkloadsOf(source string) []workload.Workload {
	return slices.DeleteFunc(a.Workloads(), func(w workload.Workload) bool { return w.Source != source })
}

// dropWorkloadsOf removes every workload of a source whose watcher the
// configuration no longer runs: nothing would keep them current (their
// containers may go, their addresses be reused).
func (a *Agent) dropWorkloadsOf(source, why string) {
	for _, w := range a.WorkloadsOf(source) {
		a.log.Info(why+": dropping a workload nothing keeps current", "workload", w.String())
		if err := a.RemoveWorkload(w.Source, w.ID); err != nil {
			a.log.Error("workload not removed", "workload", w.String(), "error", err.Error())
		}
	}
}

// workloadOf is the workload that asks for rule r. Called with a.mu held.
func (a *Agent) workloadOf(r policy.Rule) (workload.Workload, bool) {
	for _, w := range a.workloads {
		rs, _ := w.Rules()
		if slices.ContainsFunc(rs, func(o policy.Rule) bool { return sameMatch(o, r) }) {
			return w, true
		}
	}
	return workload.Workload{}, false
}

// served says whether the lanes that take workloads serve every
// address of w (as their last discovery found the endpoints) and, when
// not, why: an address whose endpoint needs a filter skipped (a lane
// that takes workloads never skips one), or one no lane has discovered
// yet (the container is not plugged, or the watch has not synced).
// Called with a.mu held.
func (a *Agent) served(w workload.Workload) (bool, string) {
	if !w.InLane() {
		return false, ""
	}
	var why []string
	for _, ip := range w.IPs {
		ip = ip.Unmap()
		ok, skipped := false, ""
		for _, lr := range a.lanes {
			topo := lr.topo.Load()
			if !lr.cfg.Workloads || topo == nil {
				continue
			}
			for _, e := range topo.Endpoints {
				if e.IP != ip && !slices.Contains(e.Addrs, ip) {
					continue
				}
				if e.Skip == "" {
					ok = true
				} else {
					skipped = fmt.Sprintf("%s in the lane of %s: %s (a lane that takes workloads never skips it)", ip, laneName(lr), e.Skip)
				}
			}
		}
		switch {
		case ok:
		case skipped != "":
			why = append(why, skipped)
		default:
			why = append(why, fmt.Sprintf("%s: no lane that takes workloads has discovered its endpoint (yet)", ip))
		}
	}
	return len(why) == 0, strings.Join(why, "; ")
}

func laneName(lr *laneRun) string {
	if lr.cfg.Netns == "" {
		return "the agent's namespace"
	}
	return lr.cfg.Netns
}

// applyWorkloads reconciles the rules of every lane that takes
// workloads. Called with a.mu held.
func (a *Agent) applyWorkloads() error {
	var errs []error
	for _, lr := range a.lanes {
		if lr.cfg.Workloads {
			errs = append(errs, a.reconcileRules(lr))
		}
	}
	return errors.Join(errs...)
}

// workloadRules are the rules the workloads ask of lr, leaving out those
// that overlap a rule already in want (the configuration's and the
// runtime rules). Called with a.mu held.
func (a *Agent) workloadRules(lr *laneRun, want []policy.Rule) []policy.Rule {
	if !lr.cfg.Workloads {
		return nil
	}
	keys := make([]string, 0, len(a.workloads))
	for k := range a.workloads {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []policy.Rule
	for _, k := range keys {
		w := a.workloads[k]
		rs, err := w.Rules()
		if err != nil {
			continue // validated when set
		}
		for _, r := range rs {
			if slices.ContainsFunc(want, func(o policy.Rule) bool { return sameMatch(o, r) || policy.Overlaps(o, r) }) {
				a.log.Warn("workload rule left out: a rule of the config or the socket matches the same packets", "netns", lr.cfg.Netns, "workload", w.String(), "rule", r.String())
				continue
			}
			out = append(out, r)
		}
	}
	return out
}

// applyPending applies the pending records the CNI plugin left while no
// agent answered, oldest first, and removes them.
func (a *Agent) applyPending() {
	recs, errs := workload.TakePending(workload.PendingDir(a.cfg.AgentDir()))
	for _, err := range errs {
		a.log.Error("pending workload record dropped", "error", err.Error())
		var bad *workload.BadRecord
		if errors.As(err, &bad) {
			workload.Done(bad.Path)
		}
	}
	for _, p := range recs {
		var err error
		if p.Op == workload.OpSet {
			err = a.SetWorkload(p.Workload)
		} else {
			err = a.RemoveWorkload(p.Workload.Source, p.Workload.ID)
		}
		if err != nil {
			a.log.Error("pending workload record failed", "op", p.Op, "workload", p.Workload.String(), "error", err.Error())
		} else {
			a.log.Info("pending workload record applied", "op", p.Op, "workload", p.Workload.String())
		}
		workload.Done(p.Path)
	}
}

func (a *Agent) loadWorkloads() error {
	a.workloads = map[string]workload.Workload{}
	var ws []workload.Workload
	if _, err := journal.LoadJSON(filepath.Join(a.cfg.AgentDir(), workloadsFile), "the agent's workloads", &ws); err != nil {
		return err
	}
	for _, w := range ws {
		if err := w.Validate(); err != nil {
			a.log.Warn("saved workload dropped", "workload", w.String(), "error", err.Error())
			continue
		}
		a.workloads[w.Key()] = w
	}
	return nil
}

func (a *Agent) saveWorkloads() error {
	ws := make([]workload.Workload, 0, len(a.workloads))
	for _, w := range a.workloads {
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].Key() < ws[j].Key() })
	b, err := json.MarshalIndent(ws, "", "  ")
	if err != nil {
		return err
	}
	return journal.WriteFile(filepath.Join(a.cfg.AgentDir(), workloadsFile), b, 0o600)
}
