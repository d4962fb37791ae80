package bench

import (
	"context"
	"fmt"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/trace"
)

// TraceStageProbe reports on which CPU each stage ran, from the BPF
// tracer's per-(CPU, device) NAPI poll counters, restricted to the
// testbed's namespaces (and the per-CPU backlog, which has no device).
type TraceStageProbe struct{ t *trace.Tracer }

// Start attaches the tracer with only its counters (no per-poll events, no
// delay tracking), to keep its cost per packet small.
func (p *TraceStageProbe) Start(ctx context.Context, tb testbed.Config) error {
	var inodes []uint32
	for _, n := range testbed.Nodes {
		ino, err := trace.NetnsInode(testbed.NetnsPath(tb, n))
		if err != nil {
			return err
		}
		inodes = append(inodes, ino)
	}
	t, err := trace.Start(ctx, trace.Options{Netns: inodes, NoPolls: true, NoDelays: true})
	if err != nil {
		return err
	}
	p.t = t
	return nil
}

// Stop detaches the tracer and returns, per device, the share of its
// packets (or of its polls, for a device that polled nothing) per CPU.
// Devices with less than 1% of the busiest device's polls are left out:
// they carried only the kernel's own chatter (IPv6 neighbour discovery,
// MLD) during the run.
func (p *TraceStageProbe) Stop() (StageReport, error) {
	var sr StageReport
	if p.t == nil {
		return sr, fmt.Errorf("stage probe not started")
	}
	rep, err := p.t.Stop()
	p.t = nil
	if err != nil {
		return sr, err
	}
	pk := map[string]map[int]float64{}
	polls := map[string]map[int]float64{}
	for _, c := range rep.PollCounts {
		if pk[c.Device] == nil {
			pk[c.Device], polls[c.Device] = map[int]float64{}, map[int]float64{}
		}
		pk[c.Device][c.CPU] += float64(c.Packets)
		polls[c.Device][c.CPU] += float64(c.Polls)
	}
	var busiest float64
	for dev := range polls {
		busiest = max(busiest, sum(polls[dev]))
	}
	out := map[string]map[int]float64{}
	for dev := range pk {
		if sum(polls[dev]) < busiest/100 {
			continue
		}
		sr.Polls += uint64(sum(polls[dev]))
		m := pk[dev]
		if sum(m) == 0 {
			m = polls[dev]
		}
		total := sum(m)
		if total == 0 {
			continue
		}
		out[dev] = map[int]float64{}
		for cpu, v := range m {
			out[dev][cpu] = v / total
		}
	}
	sr.CPUs = out
	return sr, nil
}

func sum(m map[int]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}
