package isolate

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// CPUTimes is a snapshot of /proc/stat: per CPU, the ticks spent in hard
// and soft interrupt context and the ticks in total.
type CPUTimes map[int][2]uint64

// ReadCPUTimes reads ROOT/proc/stat.
func (s *System) ReadCPUTimes() (CPUTimes, error) {
	b, err := os.ReadFile(s.path("proc/stat"))
	if err != nil {
		return nil, fmt.Errorf("read cpu times: %w", err)
	}
	out := CPUTimes{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(f[0][3:])
		if err != nil {
			continue
		}
		var total, irq uint64
		for i, v := range f[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			if i >= 8 { // guest, guest_nice are already in user, nice
				break
			}
			total += n
			if i == 5 || i == 6 { // irq, softirq
				irq += n
			}
		}
		out[cpu] = [2]uint64{irq, total}
	}
	return out, nil
}

// TargetStackUtil is the share of a reserved CPU the receive stack may use
// before --auto reserves another one: headroom for bursts, as the paper
// reserves CPUs for the peak, not the mean.
const TargetStackUtil = 0.7

// AutoStack is the --auto rule. From two snapshots over a window it takes
// the receive stack's load L = Σ over online CPUs of Δ(irq+softirq)/Δtotal,
// in CPUs; it reserves k = ceil(L / TargetStackUtil) CPUs, at least 1 and
// at most online-1 (applications keep at least one), and picks the k
// highest-numbered online CPUs (CPU 0 keeps housekeeping and applications).
func AutoStack(before, after CPUTimes, online CPUSet) (CPUSet, float64, error) {
	if len(online) < 2 {
		return nil, 0, invalid("--auto needs at least 2 online CPUs (one for the stack, one for applications)")
	}
	var load float64
	for _, c := range online {
		a, b := before[c], after[c]
		if b[1] <= a[1] {
			continue
		}
		load += float64(b[0]-a[0]) / float64(b[1]-a[1])
	}
	k := int(math.Ceil(load/TargetStackUtil - 1e-9))
	k = max(1, min(k, len(online)-1))
	return append(CPUSet(nil), online[len(online)-k:]...), load, nil
}

// Online returns the online CPUs.
func (s *System) Online() (CPUSet, error) { return s.online() }
