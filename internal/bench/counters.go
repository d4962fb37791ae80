package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rxlane/rxlane/internal/snmp"
)

// CPUSample is one CPU's counters at an instant.
type CPUSample struct {
	IdleTicks    uint64 // idle + iowait, USER_HZ
	SoftirqTicks uint64
	NetRX        uint64 // NET_RX softirqs raised and run (/proc/softirqs)
	BacklogDrops uint64 // /proc/net/softnet_stat column 2
	Squeezed     uint64 // time_squeeze: net_rx_action ran out of budget/time
	// ReschedIPIs, CallIPIs: the CPU's rescheduling and function-call
	// interrupts (/proc/interrupts RES and CAL; 0 where it has none).
	ReschedIPIs, CallIPIs uint64
	// IdleEntries: the CPU's entries into its cpuidle states (the sum of
	// /sys/devices/system/cpu/cpuN/cpuidle/state*/usage; 0 without
	// cpuidle).
	IdleEntries uint64
}

// HostSample is a snapshot of the machine-wide counters a run reads before
// and after.
type HostSample struct {
	At   time.Time
	CPUs []CPUSample
}

// userHZ is the unit of /proc/stat; it is 100 on every Linux architecture
// that matters here.
const userHZ = 100

// SampleHost reads /proc/stat, /proc/softirqs and /proc/net/softnet_stat.
func SampleHost() (HostSample, error) {
	s := HostSample{At: time.Now()}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, fmt.Errorf("read /proc/stat: %w", err)
	}
	for _, line := range strings.Split(string(stat), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		id, err := strconv.Atoi(f[0][3:])
		if err != nil {
			continue
		}
		for len(s.CPUs) <= id {
			s.CPUs = append(s.CPUs, CPUSample{})
		}
		idle, _ := strconv.ParseUint(f[4], 10, 64)
		iowait, _ := strconv.ParseUint(f[5], 10, 64)
		sirq, _ := strconv.ParseUint(f[7], 10, 64)
		s.CPUs[id].IdleTicks = idle + iowait
		s.CPUs[id].SoftirqTicks = sirq
	}
	sirqs, err := os.ReadFile("/proc/softirqs")
	if err != nil {
		return s, fmt.Errorf("read /proc/softirqs: %w", err)
	}
	for _, line := range strings.Split(string(sirqs), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == "NET_RX:" {
			for i, v := range f[1:] {
				if i < len(s.CPUs) {
					s.CPUs[i].NetRX, _ = strconv.ParseUint(v, 10, 64)
				}
			}
		}
	}
	// softnet_stat has one line per possible CPU with a CPU id in
	// column 13 on kernels >= 5.10; fall back to the line number.
	sn, err := os.Open("/proc/net/softnet_stat")
	if err != nil {
		return s, fmt.Errorf("read softnet_stat: %w", err)
	}
	defer sn.Close()
	sc := bufio.NewScanner(sn)
	for i := 0; sc.Scan(); i++ {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		id := i
		if len(f) >= 13 {
			if v, err := strconv.ParseUint(f[12], 16, 64); err == nil {
				id = int(v)
			}
		}
		if id < len(s.CPUs) {
			s.CPUs[id].BacklogDrops, _ = strconv.ParseUint(f[1], 16, 64)
			s.CPUs[id].Squeezed, _ = strconv.ParseUint(f[2], 16, 64)
		}
	}
	readIPIs(s.CPUs)
	readIdleEntries(cpuSysfs, s.CPUs)
	return s, nil
}

// cpuSysfs is where the CPUs' sysfs directories are (tests give
// readIdleEntries a fake root instead).
const cpuSysfs = "/sys/devices/system/cpu"

// readIdleEntries fills cpus' IdleEntries from root/cpuN/cpuidle: every
// time a CPU goes idle the idle loop enters one of its states, and it
// re-enters one within an idle period only when the polling state's
// time limit runs out (so a long idle period counts more than once), so
// under load their rate counts the CPU's idle periods: how many of its
// wake-ups came from idle, untraced.
func readIdleEntries(root string, cpus []CPUSample) {
	for id := range cpus {
		states, _ := filepath.Glob(filepath.Join(root, fmt.Sprintf("cpu%d", id), "cpuidle", "state*", "usage"))
		var n uint64
		for _, st := range states {
			b, err := os.ReadFile(st)
			if err != nil {
				continue
			}
			v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err == nil {
				n += v
			}
		}
		cpus[id].IdleEntries = n
	}
}

// readIPIs fills cpus' ReschedIPIs and CallIPIs from /proc/interrupts,
// whose header names the CPU of each column; without the file (or the
// lines) they stay 0.
func readIPIs(cpus []CPUSample) {
	b, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		return
	}
	parseIPIs(string(b), cpus)
}

func parseIPIs(text string, cpus []CPUSample) {
	lines := strings.Split(text, "\n")
	if len(lines) == 0 {
		return
	}
	var cols []int // CPU id of each count column
	for _, h := range strings.Fields(lines[0]) {
		id, err := strconv.Atoi(strings.TrimPrefix(h, "CPU"))
		if err != nil {
			return
		}
		cols = append(cols, id)
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) == 0 || (f[0] != "RES:" && f[0] != "CAL:") {
			continue
		}
		for i, id := range cols {
			if i+1 >= len(f) || id >= len(cpus) {
				continue
			}
			v, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				break
			}
			if f[0] == "RES:" {
				cpus[id].ReschedIPIs = v
			} else {
				cpus[id].CallIPIs = v
			}
		}
	}
}

// CPUUsage is a CPU's activity between two samples.
type CPUUsage struct {
	CPU int `json:"cpu"`
	// BusyPct is 100 * (1 - idle time / wall time). /proc/stat's other
	// columns are unreliable on tickless kernels without IRQ time
	// accounting (softirq work run from idle lands in no column), but idle
	// against the wall clock is accurate to a few points.
	BusyPct float64 `json:"busy_pct"`
	// SoftirqPct is the softirq column of /proc/stat: a lower bound.
	SoftirqPct     float64 `json:"softirq_pct"`
	NetRXPerSec    float64 `json:"net_rx_per_sec"`
	BacklogDrops   uint64  `json:"backlog_drops"`
	BudgetSqueezed uint64  `json:"budget_squeezed"`
	// IPIsPerSec: rescheduling and function-call interrupts the CPU
	// took (a wake-up from another CPU that could not just set the
	// polling idle CPU's flag; on a VM each is a costly exit).
	IPIsPerSec float64 `json:"ipis_per_sec"`
	// IdleEntriesPerSec: the CPU's entries into idle a second (cpuidle
	// states' usage; absent without cpuidle): how often it went idle and
	// so paid a wake-up to work again.
	IdleEntriesPerSec float64 `json:"idle_entries_per_sec,omitempty"`
}

// Usage returns per-CPU activity from a to b.
func Usage(a, b HostSample) []CPUUsage {
	wall := b.At.Sub(a.At).Seconds()
	var out []CPUUsage
	for i := range b.CPUs {
		if i >= len(a.CPUs) || wall <= 0 {
			break
		}
		x, y := a.CPUs[i], b.CPUs[i]
		idle := float64(y.IdleTicks-x.IdleTicks) / userHZ
		busy := 100 * (1 - idle/wall)
		out = append(out, CPUUsage{
			CPU:               i,
			BusyPct:           clampPct(busy),
			SoftirqPct:        clampPct(100 * float64(y.SoftirqTicks-x.SoftirqTicks) / userHZ / wall),
			NetRXPerSec:       float64(y.NetRX-x.NetRX) / wall,
			BacklogDrops:      y.BacklogDrops - x.BacklogDrops,
			BudgetSqueezed:    y.Squeezed - x.Squeezed,
			IPIsPerSec:        float64(y.ReschedIPIs+y.CallIPIs-x.ReschedIPIs-x.CallIPIs) / wall,
			IdleEntriesPerSec: float64(y.IdleEntries-x.IdleEntries) / wall,
		})
	}
	return out
}

func clampPct(v float64) float64 {
	if v < 0 {
		return 0
	}
	if v > 100 {
		return 100
	}
	return v
}

// UDPStats are the UDP counters of one network namespace (read from
// /proc/thread-self/net/snmp on a thread inside it).
type UDPStats struct {
	InDatagrams  uint64
	InErrors     uint64
	RcvbufErrors uint64
}

// ReadUDPStats reads the calling thread's namespace's UDP counters.
func ReadUDPStats() (UDPStats, error) {
	m, err := snmp.Read(snmp.Path, "Udp:InDatagrams", "Udp:InErrors", "Udp:RcvbufErrors")
	if err != nil {
		return UDPStats{}, err
	}
	return UDPStats{InDatagrams: m["Udp:InDatagrams"], InErrors: m["Udp:InErrors"], RcvbufErrors: m["Udp:RcvbufErrors"]}, nil
}
