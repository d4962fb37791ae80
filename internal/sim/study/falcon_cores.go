package study

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/rxlane/rxlane/internal/sim"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// FalconCoreCounts are the machine sizes of the FALCON study
// (`rxlane sim figures --only falcon-cores`, docs/steer.md).
var FalconCoreCounts = []int{4, 6, 8, 12, 16, 20}

// costModel is one set of stage costs for the FALCON study: the
// scenarios as written (paper-like costs) or calibrated to this VM.
type costModel struct {
	name          string
	single, multi []string // --set overrides of falcon-single-flow / falcon-multi
}

// falconCostModels: "paper" runs the scenarios as written; "calibrated"
// takes the stage costs and poll_ns of this VM from the committed costs
// file, corrected for the tracer with falcon-vm.yaml's calibrate_scale
// (fitted to the untraced 225 kpps), on the same 4-stage path as the VM
// (eth, ip, vxlan, veth). ISR, IPI, softirq entry and the application's
// cost stay as the scenarios write them (not traced).
func falconCostModels(scenDir string) ([]costModel, error) {
	vm, err := sim.LoadScenario(filepath.Join(scenDir, "falcon-vm.yaml"), nil)
	if err != nil {
		return nil, err
	}
	cal := []string{
		"calibrate_from=" + vm.CalibrateFrom,
		fmt.Sprintf("calibrate_scale=%g", vm.CalibrateScale),
		"calibrate_devices={eth: wireB, ip: backlog, vxlan: vxB, veth: backlog}",
	}
	multi := append([]string{
		"stages=[{name: eth, kind: nic, cost: 1}, {name: ip, kind: backlog, cost: 1}, {name: vxlan, kind: gro, cost: 1}, {name: veth, kind: backlog, cost: 1}]",
		"flows.c.path=[eth, ip, vxlan, veth]", "flows.hot.path=[eth, ip, vxlan, veth]",
	}, cal...)
	return []costModel{
		{name: "paper costs", single: nil, multi: nil},
		{name: fmt.Sprintf("calibrated (this VM, scale %g)", vm.CalibrateScale), single: cal, multi: multi},
	}, nil
}

// falconStudy runs the scenario variants of one cost model.
type falconStudy struct {
	dir   string
	model costModel
	log   io.Writer
	runs  int
	extra []string // --set overrides of every run, applied last
}

func (s *falconStudy) run(file string, sets []string) (*sim.Result, error) {
	base := s.model.single
	if file == "falcon-multi.yaml" {
		base = s.model.multi
	}
	sc, err := sim.LoadScenario(filepath.Join(s.dir, file), append(append(append([]string(nil), base...), sets...), s.extra...))
	if err != nil {
		return nil, err
	}
	s.runs++
	return sim.Run(sc), nil
}

// mlfr: highest rate of flow udp the scenario sustains (at most 0.1%
// dropped, 99% completed; bisection, 11 steps up to hi).
func (s *falconStudy) mlfr(sets []string, hi float64) (float64, error) {
	lo := 0.0
	for i := 0; i < 11; i++ {
		mid := (lo + hi) / 2
		r, err := s.run("falcon-single-flow.yaml", append(append([]string(nil), sets...), fmt.Sprintf("flows.udp.arrival.rate_pps=%g", mid)))
		if err != nil {
			return 0, err
		}
		if sustains(r, r.FlowByName("udp")) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

func singleSets(n int, mode string) []string {
	fc := []string{"1"}
	for i := 3; i < n; i++ {
		fc = append(fc, fmt.Sprint(i))
	}
	return []string{"duration_ms=30", "warmup_ms=5", fmt.Sprintf("cpus=%d", n),
		fmt.Sprintf("steering={mode: %s, rps_cpus: [1], falcon_cpus: [%s], threshold: 0.9, window_us: 1000}", mode, strings.Join(fc, ", "))}
}

// SingleFlowPoint is one core count of FALCON Fig. 10/11.
type SingleFlowPoint struct {
	Cores                      int
	Host, Vanilla, Falcon      float64 // highest sustained rate, pps
	VanillaBusy, FalconBusy    []float64
	FalconCPUsUsed             int // CPUs >= 3 busier than 10% at FALCON's max
	FalconBottleneck, VanBneck string
}

// MultiPoint is one (core count, load level) of FALCON Fig. 14.
type MultiPoint struct {
	Cores, Containers                 int
	Load                              float64 // offered, in units of the cores' vanilla capacity
	Vanilla, Falcon                   float64 // delivered pps
	VanillaBusy, FalconBusy, FalconOn float64
}

// load levels of Fig. 14: containers per core and offered load. The
// paper: 6 containers on 6 cores ~70% busy, 10 still idle cycles, 20
// and more saturated (100%), up to 40.
var fig14Levels = []struct{ perCore, load float64 }{{1, 0.7}, {10.0 / 6, 0.9}, {20.0 / 6, 1.2}, {40.0 / 6, 1.6}}

var fig15Thresholds = []string{"0.6", "0.7", "0.8", "0.85", "0.9", "0.95", "1.0"}

// multiSets: n receive CPUs (RSS over all, FALCON_CPUS = all), k
// containers of one flow each at rate pps, 2n server threads.
func multiSets(n, k int, rate float64, mode string) []string {
	rss := make([]string, n)
	for i := range rss {
		rss[i] = fmt.Sprint(i)
	}
	return []string{"duration_ms=30", "warmup_ms=5", fmt.Sprintf("cpus=%d", n),
		fmt.Sprintf("nic.rss_cpus=[%s]", strings.Join(rss, ", ")), fmt.Sprintf("apps.server.threads=%d", 2*n),
		"steering.mode=" + mode, "steering.falcon_cpus=[" + strings.Join(rss, ", ") + "]",
		fmt.Sprintf("flows.c.copies=%d", k), fmt.Sprintf("flows.c.arrival.rate_pps=%g", rate)}
}

func busyAvg(r *sim.Result) float64 {
	b := 0.0
	for _, c := range r.CPUs {
		b += 1 - c.Idle
	}
	return b / float64(len(r.CPUs))
}

func total(r *sim.Result) float64 {
	return r.FlowByName("c").ThroughputPps + r.FlowByName("hot").ThroughputPps
}

// perPacketCPU measures vanilla's CPU time per packet (core-seconds) on
// n cores with n containers at 0.2 cores each (light enough that no
// core saturates even when three flows hash to it, so no work is wasted
// on packets dropped later), to set the offered loads of Fig. 14-16 in
// units of the cores' capacity.
func (s *falconStudy) perPacketCPU(n int) (float64, error) {
	guess := 2.0e-6
	for i := 0; i < 3; i++ {
		rate := 0.2 / guess // per container: a fifth of a core
		r, err := s.run("falcon-multi.yaml", multiSets(n, n, rate, "none"))
		if err != nil {
			return 0, err
		}
		d := total(r)
		if d <= 0 {
			return 0, fmt.Errorf("falcon-cores: no packets delivered on %d cores", n)
		}
		guess = busyAvg(r) * float64(n) / d
	}
	return guess, nil
}

// FalconCores runs the FALCON study for every core count and cost model
// and writes falcon-cores.md and PNG plots into dir.
func FalconCores(scenDir, dir string, log io.Writer, extra ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create output dir: %w", err)
	}
	models, err := falconCostModels(scenDir)
	if err != nil {
		return err
	}
	var md strings.Builder
	md.WriteString("# FALCON vs core count (simulator)\n\nGenerated by `rxlane sim figures --only falcon-cores`. Scenarios `falcon-single-flow.yaml` (Fig. 10/11) and `falcon-multi.yaml` (Fig. 14-16), per cost model; see docs/steer.md for the paper's numbers beside these.\n\n")
	if len(extra) > 0 {
		fmt.Fprintf(&md, "Every run with `--set %s`.\n\n", strings.Join(extra, " --set "))
	}
	singles := make([][]SingleFlowPoint, len(models))
	multis := make([][][]MultiPoint, len(models))
	fig16 := make([][][2]float64, len(models)) // per model, per cores: [static, dynamic] at hot = 1 core
	for mi, m := range models {
		st := &falconStudy{dir: scenDir, model: m, log: log, extra: extra}
		fmt.Fprintf(log, "falcon-cores: %s\n", m.name)
		// ---- Fig. 10/11: single flow ----
		fmt.Fprintf(&md, "## %s\n\n### Fig. 10/11: one 16 B UDP flow, highest sustained rate (kpps; <= 0.1%% dropped, >= 99%% delivered) and busy CPUs at that rate\n\n", m.name)
		md.WriteString("| cores | host | vanilla overlay | FALCON | FALCON / vanilla | FALCON / host | vanilla busy % (CPU 0 / 1 / 2) | FALCON busy % (CPU 0 / 1 / 2 / others used) |\n|---|---|---|---|---|---|---|---|\n")
		for _, n := range FalconCoreCounts {
			p := SingleFlowPoint{Cores: n}
			host := append(singleSets(n, "rps"), "flows.udp.path=[eth, ip]")
			if p.Host, err = st.mlfr(host, 4e6); err != nil {
				return err
			}
			if p.Vanilla, err = st.mlfr(singleSets(n, "rps"), 4e6); err != nil {
				return err
			}
			if p.Falcon, err = st.mlfr(singleSets(n, "falcon"), 4e6); err != nil {
				return err
			}
			busy := func(mode string, rate float64) ([]float64, error) {
				r, err := st.run("falcon-single-flow.yaml", append(singleSets(n, mode), fmt.Sprintf("flows.udp.arrival.rate_pps=%g", rate)))
				if err != nil {
					return nil, err
				}
				var b []float64
				for _, c := range r.CPUs {
					b = append(b, 100*(1-c.Idle))
				}
				return b, nil
			}
			if p.VanillaBusy, err = busy("rps", p.Vanilla); err != nil {
				return err
			}
			if p.FalconBusy, err = busy("falcon", p.Falcon); err != nil {
				return err
			}
			others, oth := 0, 0.0
			for i := 3; i < n; i++ {
				if p.FalconBusy[i] > 10 {
					others++
					oth += p.FalconBusy[i]
				}
			}
			p.FalconCPUsUsed = others
			if others > 0 {
				oth /= float64(others)
			}
			singles[mi] = append(singles[mi], p)
			fmt.Fprintf(&md, "| %d | %.0f | %.0f | %.0f | %.2fx | %.0f%% | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f / %d at %.0f |\n",
				n, p.Host/1e3, p.Vanilla/1e3, p.Falcon/1e3, p.Falcon/p.Vanilla, 100*p.Falcon/p.Host,
				p.VanillaBusy[0], p.VanillaBusy[1], p.VanillaBusy[2], p.FalconBusy[0], p.FalconBusy[1], p.FalconBusy[2], others, oth)
		}
		// Fig. 10's packet sizes: the model has no per-byte cost, so
		// size enters only through the link's packet rate.
		md.WriteString("\nFig. 10 packet sizes, 8 cores: min(highest sustained rate, link rate) in kpps; the model has no per-byte cost, so the size only enters through the link's packet rate (frame = payload + 42 B UDP/IP/Ethernet + 50 B VXLAN outer for the overlay + 24 B FCS/preamble/gap).\n\n| payload | 10G host / vanilla / FALCON | 100G host / vanilla / FALCON |\n|---|---|---|\n")
		var p8 SingleFlowPoint
		for _, p := range singles[mi] {
			if p.Cores == 8 {
				p8 = p
			}
		}
		for _, size := range []int{16, 64, 256, 1024, 1472} {
			fmt.Fprintf(&md, "| %d B |", size)
			for _, gbps := range []float64{10, 100} {
				line := func(overlay bool) float64 {
					b := float64(size + 42 + 24)
					if overlay {
						b += 50
					}
					return gbps * 1e9 / (8 * b)
				}
				fmt.Fprintf(&md, " %.0f / %.0f / %.0f |", math.Min(p8.Host, line(false))/1e3, math.Min(p8.Vanilla, line(true))/1e3, math.Min(p8.Falcon, line(true))/1e3)
			}
			md.WriteString("\n")
		}
		// ---- the closed loop on Fig. 10's single flow ----
		if err := st.loopSection(&md, singles[mi]); err != nil {
			return err
		}
		// ---- Fig. 14: multi-container, busy system ----
		fmt.Fprintf(&md, "\n### Fig. 14: containers (one flow each) on N receive cores, RSS vs FALCON (threshold 0.85)\n\nOffered load in units of the N cores' vanilla capacity (measured CPU time per packet); containers per core 1, 1.67, 3.33, 6.67 as the paper's 6, 10, 20, 40 on 6 cores. Delivered kpps vanilla / FALCON (gain), average busy %% vanilla / FALCON, FALCON on %% of the time.\n\n| cores |")
		for _, l := range fig14Levels {
			fmt.Fprintf(&md, " load %.1f, %.2f containers/core |", l.load, l.perCore)
		}
		md.WriteString("\n|---|")
		for range fig14Levels {
			md.WriteString("---|")
		}
		md.WriteString("\n")
		cpp := map[int]float64{}
		for _, n := range FalconCoreCounts {
			c, err := st.perPacketCPU(n)
			if err != nil {
				return err
			}
			cpp[n] = c
			var row []MultiPoint
			fmt.Fprintf(&md, "| %d |", n)
			for _, l := range fig14Levels {
				k := int(math.Round(l.perCore * float64(n)))
				rate := l.load * float64(n) / c / float64(k)
				v, err := st.run("falcon-multi.yaml", multiSets(n, k, rate, "none"))
				if err != nil {
					return err
				}
				f, err := st.run("falcon-multi.yaml", multiSets(n, k, rate, "falcon"))
				if err != nil {
					return err
				}
				on := 0.0
				if f.FalconOn != nil {
					on = *f.FalconOn
				}
				p := MultiPoint{Cores: n, Containers: k, Load: l.load, Vanilla: total(v), Falcon: total(f), VanillaBusy: busyAvg(v), FalconBusy: busyAvg(f), FalconOn: on}
				row = append(row, p)
				fmt.Fprintf(&md, " %.0f / %.0f (%s), %.0f / %.0f%%, on %.0f%% |", p.Vanilla/1e3, p.Falcon/1e3, pct(p.Falcon, p.Vanilla), 100*p.VanillaBusy, 100*p.FalconBusy, 100*on)
			}
			md.WriteString("\n")
			multis[mi] = append(multis[mi], row)
		}
		// ---- Fig. 15: threshold ----
		md.WriteString("\n### Fig. 15: FALCON_LOAD_THRESHOLD, delivered relative to vanilla (RSS) at the same load\n\n| cores | load |")
		for _, th := range fig15Thresholds {
			if th == "1.0" {
				md.WriteString(" 1.0 (always on) |")
			} else {
				fmt.Fprintf(&md, " %s |", th)
			}
		}
		md.WriteString("\n|---|---|")
		for range fig15Thresholds {
			md.WriteString("---|")
		}
		md.WriteString("\n")
		for ni, n := range FalconCoreCounts {
			for _, li := range []int{1, 2} {
				l := fig14Levels[li]
				k := int(math.Round(l.perCore * float64(n)))
				rate := l.load * float64(n) / cpp[n] / float64(k)
				van := multis[mi][ni][li].Vanilla
				fmt.Fprintf(&md, "| %d | %.1f |", n, l.load)
				for _, th := range fig15Thresholds {
					r, err := st.run("falcon-multi.yaml", append(multiSets(n, k, rate, "falcon"), "steering.threshold="+th))
					if err != nil {
						return err
					}
					fmt.Fprintf(&md, " %s |", pct(total(r), van))
				}
				md.WriteString("\n")
			}
		}
		// ---- Fig. 16: hotspot ----
		md.WriteString("\n### Fig. 16: hotspot, two-choice (dynamic) vs static hashing\n\nN containers at 0.6 of the cores' capacity plus one hot container at 0.5 / 1 / 1.5 cores' worth of packets. Total delivered kpps static / dynamic (gain).\n\n| cores | hot 0.5 core | hot 1 core | hot 1.5 cores |\n|---|---|---|---|\n")
		for _, n := range FalconCoreCounts {
			rate := 0.6 / cpp[n]
			fmt.Fprintf(&md, "| %d |", n)
			for _, h := range []float64{0.5, 1, 1.5} {
				var got [2]float64
				for i, static := range []string{"true", "false"} {
					r, err := st.run("falcon-multi.yaml", append(multiSets(n, n, rate, "falcon"), "steering.static="+static, fmt.Sprintf("flows.hot.arrival.rate_pps=%g", h/cpp[n])))
					if err != nil {
						return err
					}
					got[i] = total(r)
				}
				if h == 1 {
					fig16[mi] = append(fig16[mi], got)
				}
				fmt.Fprintf(&md, " %.0f / %.0f (%s) |", got[0]/1e3, got[1]/1e3, pct(got[1], got[0]))
			}
			md.WriteString("\n")
		}
		fmt.Fprintf(&md, "\n(%d simulator runs; CPU time per packet, vanilla, 0.2 cores per container:", st.runs)
		for _, n := range FalconCoreCounts {
			fmt.Fprintf(&md, " %d cores %.2f us;", n, cpp[n]*1e6)
		}
		md.WriteString(")\n\n")
	}
	if err := loopVMSection(&md, scenDir, extra); err != nil {
		return err
	}
	if err := plotFalconCores(models, singles, multis, fig16, dir); err != nil {
		return err
	}
	md.WriteString("![single flow](falcon-cores-fig10.png)\n\n![multi](falcon-cores-fig14-16.png)\n")
	return os.WriteFile(filepath.Join(dir, "falcon-cores.md"), []byte(md.String()), 0o644)
}

func plotFalconCores(models []costModel, singles [][]SingleFlowPoint, multis [][][]MultiPoint, fig16 [][][2]float64, dir string) error {
	short := []string{"paper", "calibrated"}
	var args []any
	for mi := range models {
		van, fal := plotter.XYs{}, plotter.XYs{}
		for _, pt := range singles[mi] {
			van = append(van, plotter.XY{X: float64(pt.Cores), Y: pt.Vanilla / pt.Host})
			fal = append(fal, plotter.XY{X: float64(pt.Cores), Y: pt.Falcon / pt.Host})
		}
		args = append(args, "vanilla, "+short[mi], van, "FALCON, "+short[mi], fal)
	}
	p, err := linePlot("FALCON Fig. 10 (sim): single 16 B flow, highest sustained rate / host", "cores", "fraction of the host network's rate", args)
	if err != nil {
		return err
	}
	p.Y.Min, p.Y.Max = 0, 1.05
	p.Legend.Top, p.Legend.Left = false, false
	if err := p.Save(figW, figH, filepath.Join(dir, "falcon-cores-fig10.png")); err != nil {
		return err
	}
	args = nil
	for mi := range models {
		for li, l := range fig14Levels[:3] {
			xy := plotter.XYs{}
			for ni, row := range multis[mi] {
				xy = append(xy, plotter.XY{X: float64(FalconCoreCounts[ni]), Y: 100 * (row[li].Falcon/row[li].Vanilla - 1)})
			}
			args = append(args, fmt.Sprintf("Fig.14 load %.1f, %s", l.load, short[mi]), xy)
		}
		xy := plotter.XYs{}
		for ni, g := range fig16[mi] {
			xy = append(xy, plotter.XY{X: float64(FalconCoreCounts[ni]), Y: 100 * (g[1]/g[0] - 1)})
		}
		args = append(args, "Fig.16 two-choice vs static, hot 1 core, "+short[mi], xy)
	}
	p, err = linePlot("FALCON Fig. 14/16 (sim): throughput gain over vanilla / static", "cores", "gain (%)", args)
	if err != nil {
		return err
	}
	p.Legend.Top = true
	p.Y.Max *= 1.8 // room for the legend
	return p.Save(8*vg.Inch, 6*vg.Inch, filepath.Join(dir, "falcon-cores-fig14-16.png"))
}
