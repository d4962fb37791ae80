package steer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSpareCPU(t *testing.T) {
	set := []int{0, 1, 2, 3}
	for _, tc := range []struct {
		name       string
		rx         []int
		load, task map[int]float64
		off        bool
		want       bool
		why        string
	}{
		{"idle CPU besides the receive CPU", []int{1}, map[int]float64{1: 0.9}, map[int]float64{}, true, true, ""},
		{"every other CPU runs tasks", []int{1}, map[int]float64{0: 0.9, 1: 0.9, 2: 0.7, 3: 0.6}, map[int]float64{0: 0.85, 2: 0.6, 3: 0.5}, true, false, "CPU 0 85% in tasks, CPU 2 60% in tasks, CPU 3 50% in tasks"},
		// Off, a CPU busy with softirqs (another instance's stages) is
		// not spare; steered, the load may be our own stages'.
		{"softirq-busy while off", []int{1}, map[int]float64{0: 0.9, 2: 0.95, 3: 0.9}, map[int]float64{0: 0.1, 2: 0.1, 3: 0.1}, true, false, "CPU 0 90% busy"},
		{"softirq-busy while steered", []int{1}, map[int]float64{0: 0.9, 2: 0.95, 3: 0.9}, map[int]float64{0: 0.1, 2: 0.1, 3: 0.1}, false, true, ""},
		{"receive CPUs are the whole set", []int{0, 1, 2, 3}, map[int]float64{}, map[int]float64{}, true, false, "no CPU in the set besides"},
		{"receive CPUs unknown: the whole set is a candidate", nil, map[int]float64{}, map[int]float64{0: 0.9}, true, true, ""},
	} {
		got, why := spareCPU(set, tc.rx, tc.load, tc.task, 0.5, 0.85, tc.off)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: spare %v (%q), want %v (%q)", tc.name, got, why, tc.want, tc.why)
		}
	}
}

func TestLoopCounterFiles(t *testing.T) {
	dir := t.TempDir()
	stat := filepath.Join(dir, "stat")
	os.WriteFile(stat, []byte("cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 100 5 50 1000 20 3 7 0 0 0\ncpu1 1 2 3 4 5 6 7 0 0 0\nintr 1\n"), 0o644)
	idle, task, err := readCPUTimes(stat)
	if err != nil {
		t.Fatal(err)
	}
	tick := time.Second / UserHZ
	if task[0] != 155*tick || idle[0] != 1020*tick || task[1] != 6*tick || idle[1] != 9*tick {
		t.Fatalf("task %v idle %v: want user+nice+system and idle+iowait", task, idle)
	}
	softnet := filepath.Join(dir, "softnet")
	os.WriteFile(softnet, []byte("00be02ba 0000000a 00000008\n0a10d976 00001812 00000763\n"), 0o644)
	if n, err := readBacklogDrops(softnet); err != nil || n != 0xa+0x1812 {
		t.Fatalf("backlog drops %d (%v), want the hex second column summed", n, err)
	}
}
