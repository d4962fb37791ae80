package sim

import "github.com/rxlane/rxlane/internal/falcon"

// steering is the scenario's steering mode (none, rps, falcon): at a
// stage transition it picks the CPU whose backlog runs the packet's next
// stage. Like policy, the model asks it and has no branch per mode.
type steering interface {
	// start begins what the mode samples while the model runs.
	start()
	// target is the backlog that takes p's next stage st, or nil to
	// leave the stage on this CPU (its GRO cell or backlog).
	target(p *packet, st *stage) *napi
	// steersSplit reports whether a split stage's second half goes
	// through a transition now; else it runs inline, as in the kernel.
	steersSplit() bool
	// enabledFraction is the share of the window the mode steered,
	// for the result (nil: not reported).
	enabledFraction() *float64
}

func newSteering(m *Model) steering {
	st := &m.sc.Steering
	switch st.Mode {
	case "rps":
		return newRPS(m, st.RPSCPUs)
	case "falcon":
		return newFalcon(m, st)
	}
	return noSteering{}
}

// noSteering leaves every stage on the CPU that ran the previous one.
type noSteering struct{}

func (noSteering) start()                            {}
func (noSteering) target(p *packet, st *stage) *napi { return nil }
func (noSteering) steersSplit() bool                 { return false }
func (noSteering) enabledFraction() *float64         { return nil }

// rps is get_rps_cpu: a backlog stage goes to the RPS map's CPU its flow
// hash scales to. A GRO stage stays in this CPU's gro_cells.
type rps struct{ cpus []*cpu }

func newRPS(m *Model, cpus []int) *rps {
	r := &rps{}
	for _, c := range cpus {
		r.cpus = append(r.cpus, m.cpus[c])
	}
	return r
}

func (r *rps) start() {}

func (r *rps) target(p *packet, st *stage) *napi {
	if st.kind == kindGRO || len(r.cpus) == 0 {
		return nil
	}
	return r.cpus[reciprocalScale(p.hash, len(r.cpus))].backlog
}

func (r *rps) steersSplit() bool         { return false }
func (r *rps) enabledFraction() *float64 { return nil }

// falconSteering is FALCON: while the average load of all CPUs is below
// the threshold (sampled every window_us), every stage, split halves
// included, goes to the backlog of the CPU internal/falcon's rule picks;
// above it, stages go where RPS (off, possibly with an empty map) sends
// them. With steering.loop, the closed loop (loop.go) decides whether
// FALCON runs at all: in its off placement every stage goes where RPS
// sends it, whatever the load.
type falconSteering struct {
	m     *Model
	spec  *Steering // read at each choice: tests change Static in place
	cpus  []int     // FALCON_CPUS
	loads []float64 // the rule's input, per position of cpus
	off   *rps
	loop  *loopDriver // nil: no closed loop

	on     bool
	onTime timeIn // time steering within the window
}

func newFalcon(m *Model, st *Steering) *falconSteering {
	f := &falconSteering{m: m, spec: st, cpus: st.FalconCPUs, loads: make([]float64, len(st.FalconCPUs)), off: newRPS(m, st.RPSCPUs)}
	if st.Loop != nil {
		f.loop = newLoopDriver(m, f)
	}
	return f
}

func (f *falconSteering) start() {
	f.on = true
	f.m.sim.Schedule(ns(f.spec.WindowUs*1000), f.tick)
	if f.loop != nil {
		f.loop.begin()
	}
}

// steering reports whether FALCON steers now: on by the average load,
// and placed by the loop (if any).
func (f *falconSteering) steering() bool {
	return f.on && (f.loop == nil || f.loop.place == falcon.PlaceSteered)
}

func (f *falconSteering) target(p *packet, st *stage) *napi {
	if f.steering() {
		return f.m.cpus[f.choose(p.hash, st.id)].backlog
	}
	return f.off.target(p, st)
}

func (f *falconSteering) steersSplit() bool { return f.steering() }

// choose is the CPU for the stage with device ifindex of the flow with
// hash h, by the paper's literal rehash (no ExcludeFirst).
func (f *falconSteering) choose(h, ifindex uint32) int {
	for i, c := range f.cpus {
		f.loads[i] = f.m.cpus[c].load
	}
	i, _ := falcon.Choose(falcon.Input{FlowHash: h, Stage: ifindex, CPUs: f.cpus, Loads: f.loads,
		Threshold: f.spec.Threshold, On: true, Static: f.spec.Static})
	return f.cpus[i]
}

// tick samples every CPU's load over the last window and turns FALCON on
// or off by the average.
func (f *falconSteering) tick() {
	m := f.m
	w := ns(f.spec.WindowUs * 1000)
	sum := 0.0
	for _, c := range m.cpus {
		b := c.busy()
		c.load = float64(b-c.lastBusy) / float64(w)
		c.lastBusy = b
		sum += c.load
	}
	lavg := sum / float64(len(m.cpus))
	f.count(m.sim.Now())
	f.on = lavg < f.spec.Threshold
	m.sim.Schedule(w, f.tick)
}

// count adds the time since the last count, within the window, if
// steering; it is called before anything steering() reads changes.
func (f *falconSteering) count(now int64) { f.onTime.add(f.m, now, f.steering()) }

func (f *falconSteering) enabledFraction() *float64 {
	m := f.m
	f.count(m.end)
	v := float64(f.onTime.sum) / float64(m.end-m.warm)
	return &v
}

// loopResult is the closed loop's result (nil: no loop).
func (f *falconSteering) loopResult() *LoopResult {
	if f.loop == nil {
		return nil
	}
	return f.loop.result()
}
