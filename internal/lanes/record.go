package lanes

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/nldump"
	"github.com/rxlane/rxlane/internal/overlay"
)

// The lane's record is a write-ahead journal (internal/journal): a begin
// record with how the lane was enabled, then an intent before every kernel
// change (a program attached to a device, a container veth's offload
// switched, --skip-netfilter changed by a re-enable), then commit. The
// State below is that journal replayed. Undo takes the intents last first;
// each undo step is harmless when its change never happened, so a lane
// killed between an intent and its change is undone exactly as well.

// laneBegin is the begin record.
type laneBegin struct {
	Netns    string `json:"netns"`
	NetnsIno uint64 `json:"netns_ino,omitempty"`
	// NetnsCookie tells the namespace from a later one given its inode
	// (netns.CookieHere; 0: an older record, or no cookies).
	NetnsCookie    uint64 `json:"netns_cookie,omitempty"`
	Mode           string `json:"mode"`
	SkipNetfilter  bool   `json:"skip_netfilter"`
	TrustOuterCsum bool   `json:"trust_outer_csum"`
	// Device is enable's --dev ("" : the tunnels' underlays).
	Device string `json:"device,omitempty"`
}

// Intent kinds.
const (
	intentAttach        = "attach"
	intentPeer          = "peer"
	intentSkipNetfilter = "skip_netfilter"
	// intentPin: the lane's objects are (about to be) pinned in this
	// directory; undo removes it.
	intentPin = "pin"
)

// State is the lane's record, replayed.
type State struct {
	Netns       string `json:"netns"`
	NetnsIno    uint64 `json:"netns_ino,omitempty"`
	NetnsCookie uint64 `json:"netns_cookie,omitempty"`
	// SkipNetfilter: endpoints whose normal path filters traffic (bridge
	// netfilter, the routed FORWARD chain where Calico enforces
	// NetworkPolicy, tc egress) are served anyway, skipping that filter.
	SkipNetfilter bool         `json:"skip_netfilter"`
	Attachments   []Attachment `json:"attachments"`
	Mode          string       `json:"mode"`
	// Peers are settings the queue lane changed on containers' veths.
	Peers []overlay.PeerOffload `json:"peers,omitempty"`
	// TrustOuterCsum is the loaded program's --trust-outer-csum.
	TrustOuterCsum bool   `json:"trust_outer_csum,omitempty"`
	Device         string `json:"device,omitempty"`
	// PinDir is where the lane's programs and maps are pinned ("": not
	// pinned).
	PinDir string `json:"pin_dir,omitempty"`
	// Committed is false while an enable is in progress, or after one
	// was killed: disable undoes what it recorded.
	Committed bool `json:"committed"`
	// Recorded is false for a lane found attached without a record.
	Recorded bool `json:"recorded"`
}

// LoadState reads a lane's record (Options.StateFile) as the State it
// describes; nil when there is none.
func LoadState(path string) (*State, error) { return loadState(path) }

// loadState replays the journal at path; nil when there is none.
func loadState(path string) (*State, error) {
	if journal.NoBegin(path) {
		// Killed while its begin record was written: nothing changed
		// yet; disable removes it.
		return &State{Recorded: true}, nil
	}
	c, err := journal.Read(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lane record: %w (an older rxlane's state file? remove it after checking `tc filter show` on the underlay)", err)
	}
	var b laneBegin
	if err := json.Unmarshal(c.Begin, &b); err != nil {
		return nil, fmt.Errorf("lane record %s: %w", path, err)
	}
	st := &State{Netns: b.Netns, NetnsIno: b.NetnsIno, NetnsCookie: b.NetnsCookie, SkipNetfilter: b.SkipNetfilter, Mode: b.Mode,
		TrustOuterCsum: b.TrustOuterCsum, Device: b.Device, Committed: c.Committed, Recorded: true}
	for _, r := range c.Intents {
		var err error
		switch r.Kind {
		case intentAttach:
			var a Attachment
			err = json.Unmarshal(r.Data, &a)
			// A device journaled again (its clsact came from someone
			// else meanwhile) keeps the later record.
			if i := slices.IndexFunc(st.Attachments, func(b Attachment) bool { return b.Device == a.Device && b.XDP == a.XDP }); i >= 0 {
				st.Attachments[i] = a
			} else {
				st.Attachments = append(st.Attachments, a)
			}
		case intentPeer:
			var p overlay.PeerOffload
			err = json.Unmarshal(r.Data, &p)
			st.Peers = append(st.Peers, p)
		case intentSkipNetfilter:
			err = json.Unmarshal(r.Data, &st.SkipNetfilter)
		case intentPin:
			err = json.Unmarshal(r.Data, &st.PinDir)
		default:
			err = fmt.Errorf("unknown intent %q", r.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("lane record %s, step %d: %w", path, r.Seq, err)
		}
	}
	return st, nil
}

// undo reverses what st records, last change first, in the calling
// thread's namespace (the lane's). Peers go after the programs: nothing
// is queued to them once the XDP program is gone; the pins go last.
func undo(st *State) error {
	var errs []error
	for i := len(st.Attachments) - 1; i >= 0; i-- {
		a := st.Attachments[i]
		if a.XDP {
			errs = append(errs, detachXDP(a))
		} else {
			errs = append(errs, detach(a))
		}
	}
	for i := len(st.Peers) - 1; i >= 0; i-- {
		errs = append(errs, overlay.RestorePeers(st.Peers[i:i+1]))
	}
	// Last: once detached, nothing runs the pinned programs.
	errs = append(errs, removePins(st.PinDir))
	return errors.Join(errs...)
}

// Program names (as the kernel keeps them: 15 characters) of the lane's
// programs, by the mode that attaches them.
var laneProgs = map[string][]string{
	ModeSync:  {"lanes_ingress", "lanes_tunnel"},
	ModeQueue: {xdpProgName},
}

// progName is the kernel's name of a loaded program.
func progName(id ebpf.ProgramID) string {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Name
}

// modeOfProg is the mode whose program is named name, or "".
func modeOfProg(name string) string {
	for m, names := range laneProgs {
		for _, n := range names {
			if name == n {
				return m
			}
		}
	}
	return ""
}

// findOurs lists rxlane's lane programs attached in the calling thread's
// namespace, recorded or not: the lane's tc filter (by priority, handle
// and name) and its XDP program (by name). It is how disable and stats
// find a lane whose record is lost (another --state-dir, a kill).
func findOurs() ([]Attachment, error) {
	links, err := nldump.Retry(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	var out []Attachment
	for _, l := range links {
		if f, err := laneFilter.Find(l); err == nil && f != nil {
			out = append(out, Attachment{Device: l.Attrs().Name, Prog: progName(ebpf.ProgramID(f.Id))})
		}
		if ourXDP(l) != 0 {
			out = append(out, Attachment{Device: l.Attrs().Name, XDP: true, Prog: xdpProgName})
		}
	}
	return out, nil
}

// unrecordedState describes a lane found attached without a record.
func unrecordedState(found []Attachment) *State {
	st := &State{Attachments: found, Mode: ModeSync}
	for _, a := range found {
		if m := modeOfProg(a.Prog); m != "" {
			st.Mode = m
		}
	}
	return st
}

// describe names attachments for a message: "wireB (tc lanes_ingress)".
func describe(as []Attachment) string {
	var s []string
	for _, a := range as {
		hook := "tc"
		if a.XDP {
			hook = "XDP"
		}
		s = append(s, fmt.Sprintf("%s (%s %s)", a.Device, hook, a.Prog))
	}
	return strings.Join(s, ", ")
}
