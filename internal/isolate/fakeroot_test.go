package isolate

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Fake machine: 8 CPUs; eth0 an 8-queue NIC (IRQ 40 misc, 41..48 queues
// eth0-TxRx-0..7, RSS table of 128 entries); up0 the "uplink" (must never
// change); veth0 a single-queue virtual device; process 100 with threads
// 100 and 101; v1 cpuset cgroup "app"; v2 cgroup "v2app" (cpuset enabled).
const (
	nQueues = 8
	nCPUs   = 8
)

func write(t *testing.T, root, rel, val string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
		t.Fatal(err)
	}
}

func fakeRoot(t *testing.T) (*System, string) {
	t.Helper()
	root := t.TempDir()
	write(t, root, "sys/devices/system/cpu/online", "0-7\n")
	var intr strings.Builder
	intr.WriteString("            CPU0       CPU1       CPU2       CPU3       CPU4       CPU5       CPU6       CPU7\n")
	irq := func(n int, name string) {
		fmt.Fprintf(&intr, " %3d:          1          0          0          0          0          0          0          0  PCI-MSI 52428%d-edge      %s\n", n, n%10, name)
		write(t, root, fmt.Sprintf("proc/irq/%d/smp_affinity_list", n), "0-7\n")
	}
	nic := func(dev string, firstIRQ int) {
		irq(firstIRQ, dev)
		write(t, root, fmt.Sprintf("sys/class/net/%s/device/msi_irqs/%d", dev, firstIRQ), "msix\n")
		for q := 0; q < nQueues; q++ {
			n := firstIRQ + 1 + q
			irq(n, fmt.Sprintf("%s-TxRx-%d", dev, q))
			write(t, root, fmt.Sprintf("sys/class/net/%s/device/msi_irqs/%d", dev, n), "msix\n")
			write(t, root, fmt.Sprintf("sys/class/net/%s/queues/rx-%d/rps_cpus", dev, q), "00\n")
			write(t, root, fmt.Sprintf("sys/class/net/%s/queues/tx-%d/xps_cpus", dev, q), fmt.Sprintf("%02x\n", 1<<q))
		}
		tab := make([]uint32, 128)
		for i := range tab {
			tab[i] = uint32(i % nQueues)
		}
		write(t, root, "fake/rss/"+dev, formatTable(tab)+"\n")
	}
	nic("eth0", 40)
	nic("up0", 60)
	write(t, root, "proc/interrupts", intr.String())
	write(t, root, "sys/class/net/veth0/queues/rx-0/rps_cpus", "00\n")
	write(t, root, "sys/class/net/veth0/queues/tx-0/tx_maxrate", "0\n") // no xps_cpus: single queue
	write(t, root, "proc/100/comm", "redis-server\n")
	for _, tid := range []int{100, 101} {
		write(t, root, fmt.Sprintf("proc/100/task/%d/comm", tid), "redis-server\n")
		write(t, root, fmt.Sprintf("fake/affinity/%d", tid), "0-7\n")
	}
	write(t, root, "proc/1/comm", "init\n")
	write(t, root, "sys/fs/cgroup/cpuset/app/cpuset.cpus", "0-7\n")
	write(t, root, "sys/fs/cgroup/cpuset/cpuset.cpus", "0-7\n")
	write(t, root, "etc/hostname", "fake\n")
	os.MkdirAll(filepath.Join(root, "etc/default"), 0o755)
	s := &System{
		Root:     root,
		RSS:      FileRSS{Dir: filepath.Join(root, "fake/rss")},
		Affinity: FileAffinity{Dir: filepath.Join(root, "fake/affinity")},
		StateDir: filepath.Join(t.TempDir(), "state"),
	}
	return s, root
}

// snapshot maps every file under root to its bytes.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[strings.TrimPrefix(p, root+"/")] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diff(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, k+": removed")
		} else if v != w {
			out = append(out, fmt.Sprintf("%s: %q -> %q", k, v, w))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k+": added")
		}
	}
	return out
}

func mustSame(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	if d := diff(before, after); len(d) > 0 {
		t.Fatalf("%s: root changed:\n  %s", what, strings.Join(d, "\n  "))
	}
}
