package bench

import (
	"os"
	"path/filepath"
	"testing"
)

// TestParseIPIs: RES and CAL counts land on the CPU their column's header
// names (CPU2 offline here: the columns are CPU0, CPU1, CPU3), other
// lines are ignored, and Usage turns them into a rate.
func TestParseIPIs(t *testing.T) {
	const text = `           CPU0       CPU1       CPU3
  1:          9          0          0  IO-APIC   1-edge      i8042
NMI:          0          0          0   Non-maskable interrupts
RES:    2311654     901953       17   Rescheduling interrupts
CAL:    4065943    5085131       23   Function call interrupts
TLB:     983294     993929        5   TLB shootdowns
`
	cpus := make([]CPUSample, 4)
	parseIPIs(text, cpus)
	want := []CPUSample{{ReschedIPIs: 2311654, CallIPIs: 4065943}, {ReschedIPIs: 901953, CallIPIs: 5085131}, {}, {ReschedIPIs: 17, CallIPIs: 23}}
	for i := range want {
		if cpus[i] != want[i] {
			t.Errorf("CPU %d: %+v, want %+v", i, cpus[i], want[i])
		}
	}
	// a CPU beyond the slice (hot-added since /proc/stat was read) is skipped
	short := make([]CPUSample, 2)
	parseIPIs(text, short)
	if short[1].CallIPIs != 5085131 {
		t.Errorf("CPU 1 of 2: %+v", short[1])
	}
	// a header that is not CPU columns leaves everything 0
	none := make([]CPUSample, 2)
	parseIPIs("garbage header\nRES: 1 2\n", none)
	if none[0] != (CPUSample{}) || none[1] != (CPUSample{}) {
		t.Errorf("unparseable header: %+v", none)
	}
	a := HostSample{CPUs: []CPUSample{{}, {ReschedIPIs: 10, CallIPIs: 5}}}
	b := HostSample{At: a.At.Add(2e9), CPUs: []CPUSample{{}, {ReschedIPIs: 110, CallIPIs: 105}}}
	if u := Usage(a, b); u[1].IPIsPerSec != 100 {
		t.Errorf("IPIs per second %v, want 100 (200 over 2 s)", u[1].IPIsPerSec)
	}
}

// TestIdleEntries: a CPU's idle entries are the sum of its cpuidle
// states' usage (a fake sysfs root: this VM's CPUs have two states, a
// real root cannot be set to known counts); a CPU without cpuidle counts
// 0, and Usage turns them into a rate.
func TestIdleEntries(t *testing.T) {
	root := t.TempDir()
	for path, v := range map[string]string{"cpu0/cpuidle/state0/usage": "7\n", "cpu0/cpuidle/state1/usage": "35\n", "cpu2/cpuidle/state0/usage": "x\n"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cpus := make([]CPUSample, 3)
	readIdleEntries(root, cpus)
	if cpus[0].IdleEntries != 42 || cpus[1].IdleEntries != 0 || cpus[2].IdleEntries != 0 {
		t.Errorf("idle entries %d %d %d, want 42 (7+35), 0 (no cpuidle) and 0 (unreadable)", cpus[0].IdleEntries, cpus[1].IdleEntries, cpus[2].IdleEntries)
	}
	a := HostSample{CPUs: []CPUSample{{IdleEntries: 100}}}
	b := HostSample{At: a.At.Add(2e9), CPUs: []CPUSample{{IdleEntries: 5100}}}
	if u := Usage(a, b); u[0].IdleEntriesPerSec != 2500 {
		t.Errorf("idle entries per second %v, want 2500", u[0].IdleEntriesPerSec)
	}
}
