package steer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"

	"github.com/rxlane/rxlane/internal/journal"
)

// The state file is a write-ahead journal (internal/journal): the begin
// record is the State as planned before any kernel change (namespace, CPU
// set, thresholds, stages, the first stage's device and CPUs), then one
// intent before each kernel change with what its undo needs, then the
// commit once Enable has returned. loadState replays it into a State, so
// a state whose enable was killed half way lists every change that may
// have been made, and disable undoes exactly those; each undo is harmless
// when its change never happened.
const (
	// kindFilter: a tc filter (Attachment: device, namespace, filter
	// identity, program ID, whether its clsact qdisc is created here).
	kindFilter = "filter"
	// kindXDP: steer_xdp attached to the first stage's device (xdpIntent).
	kindXDP = "xdp"
	// kindSenderTx: the sender end's tx checksum offload (PeerOffload).
	kindSenderTx = "sender_tx"
	// kindWireGRO: the first stage's veth's GRO (PeerOffload).
	kindWireGRO = "wire_gro"
	// kindRPS: one rx queue's rps_cpus (RPSChange with the old value).
	kindRPS = "rps"
)

// xdpIntent is the XDP program enable attaches to the first stage's
// device (in the state's namespace).
type xdpIntent struct {
	Device string `json:"device"`
	ProgID uint32 `json:"prog_id"`
}

// sameFilter reports whether two attachments name the same filter.
func sameFilter(a, b Attachment) bool {
	return a.Netns == b.Netns && a.Device == b.Device && a.Done == b.Done && a.Handle == b.Handle
}

// record applies an intent to st: what loadState replays, and what Enable
// does to its own State once the intent is on disk.
func (st *State) record(kind string, data []byte) error {
	switch kind {
	case kindFilter:
		var a Attachment
		if err := json.Unmarshal(data, &a); err != nil {
			return err
		}
		for i := range st.Attachments {
			if sameFilter(st.Attachments[i], a) { // updated (clsact after all)
				st.Attachments[i] = a
				return nil
			}
		}
		st.Attachments = append(st.Attachments, a)
	case kindRPS:
		var c RPSChange
		if err := json.Unmarshal(data, &c); err != nil {
			return err
		}
		st.RPS = append(st.RPS, c)
	case kindXDP, kindSenderTx, kindWireGRO:
		if st.FirstStage == nil {
			return fmt.Errorf("%s without a first stage", kind)
		}
		if kind == kindXDP {
			var x xdpIntent
			if err := json.Unmarshal(data, &x); err != nil {
				return err
			}
			st.FirstStage.XDPProgID = x.ProgID
			return nil
		}
		var p PeerOffload
		if err := json.Unmarshal(data, &p); err != nil {
			return err
		}
		if kind == kindWireGRO {
			st.FirstStage.WireGRO = &p
			return nil
		}
		st.FirstStage.PeerTx = &p
	case kindPark:
		var p parkIntent
		if err := json.Unmarshal(data, &p); err != nil {
			return err
		}
		st.Parked = p.Parked
		if p.PinDir != "" {
			st.PinDir = p.PinDir
		}
	case kindPlacement:
		var p placementIntent
		if err := json.Unmarshal(data, &p); err != nil {
			return err
		}
		st.Placement = p.Placement
	default:
		return fmt.Errorf("unknown change %q", kind)
	}
	return nil
}

// loadState reads the journal at path into a State (nil when there is
// none). Interrupted is set when its enable did not complete.
func loadState(path string) (*State, error) {
	c, err := journal.Read(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil && journal.NoBegin(path) {
		// Killed while creating it: nothing was changed; disable
		// removes it.
		return &State{Interrupted: true}, nil
	}
	if err != nil {
		// A state file of an rxlane before the journal: one JSON State.
		var s State
		if found, jerr := journal.LoadJSON(path, "steer state", &s); found && jerr == nil && s.CPUs != nil {
			return &s, nil
		}
		return nil, fmt.Errorf("steer state: %w", err)
	}
	var s State
	if err := json.Unmarshal(c.Begin, &s); err != nil {
		return nil, fmt.Errorf("steer state %s: %w", path, err)
	}
	s.Attachments, s.RPS = nil, nil
	for _, r := range c.Intents {
		if err := s.record(r.Kind, r.Data); err != nil {
			return nil, fmt.Errorf("steer state %s: record %d: %w", path, r.Seq, err)
		}
	}
	s.Interrupted = !c.Committed
	return &s, nil
}

// stateLog is Enable's open journal and the State it keeps in step with it.
type stateLog struct {
	l  *journal.Log
	st *State
}

// intent journals a change (durably) and records it in the State; only
// then may the caller make it.
func (j *stateLog) intent(kind string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := j.l.Intent(kind, v); err != nil {
		return err
	}
	return j.st.record(kind, b)
}

// progID is a loaded program's kernel ID (0 when the kernel does not say).
func progID(p *ebpf.Program) uint32 {
	info, err := p.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return uint32(id)
}
