package isolate

import (
	"fmt"
	"strings"
	"testing"
)

func stat(perCPU [][2]uint64) string {
	var b strings.Builder
	b.WriteString("cpu  1 2 3 4 5 6 7 0 0 0\n")
	for i, v := range perCPU {
		// user nice system idle iowait irq softirq steal guest guest_nice
		fmt.Fprintf(&b, "cpu%d %d 0 0 %d 0 0 %d 0 7 0\n", i, 0, v[1]-v[0], v[0])
	}
	b.WriteString("intr 1 2 3\n")
	return b.String()
}

func TestAutoStack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after [][2]uint64 // softirq ticks, total ticks after 100 ticks per CPU
		want  string
		load  float64
	}{
		{"idle", [][2]uint64{{0, 100}, {0, 100}, {0, 100}, {0, 100}}, "3", 0},
		{"one busy cpu", [][2]uint64{{60, 100}, {5, 100}, {0, 100}, {0, 100}}, "3", 0.65},
		{"over one cpu", [][2]uint64{{60, 100}, {60, 100}, {0, 100}, {0, 100}}, "2-3", 1.2},
		{"saturated", [][2]uint64{{100, 100}, {100, 100}, {100, 100}, {100, 100}}, "1-3", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, root := fakeRoot(t)
			zero := make([][2]uint64, len(tc.after))
			write(t, root, "proc/stat", stat(zero))
			a, err := s.ReadCPUTimes()
			if err != nil {
				t.Fatal(err)
			}
			write(t, root, "proc/stat", stat(tc.after))
			b, _ := s.ReadCPUTimes()
			got, load, err := AutoStack(a, b, NewCPUSet(0, 1, 2, 3))
			if err != nil {
				t.Fatal(err)
			}
			if got.List() != tc.want || fmt.Sprintf("%.2f", load) != fmt.Sprintf("%.2f", tc.load) {
				t.Fatalf("stack %s load %.2f, want %s %.2f", got.List(), load, tc.want, tc.load)
			}
		})
	}
	if _, _, err := AutoStack(nil, nil, NewCPUSet(0)); err == nil {
		t.Fatal("--auto on one CPU accepted")
	}
}
