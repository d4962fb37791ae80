package testbedtest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/nldump"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/testbed"
)

// Snapshot is what "the testbed as it was" means to a datapath test: for
// every node, every device's flags (not the operational "running", which
// follows carrier and bridge port states), MTU, master, attached XDP
// program, its qdiscs, its ingress and egress tc filters, the offloads
// rxlane toggles (GRO, checksums), NAPI threading and every receive
// queue's rps_cpus. Two snapshots compare as strings.
func Snapshot(t testing.TB, tb testbed.Config) string {
	t.Helper()
	var b strings.Builder
	for _, n := range testbed.Nodes {
		b.WriteString(NetnsSnapshot(t, testbed.NetnsPath(tb, n)))
	}
	return b.String()
}

// NetnsSnapshot is Snapshot for one namespace file.
func NetnsSnapshot(t testing.TB, nsPath string) string {
	t.Helper()
	var b strings.Builder
	n := filepath.Base(nsPath)
	{
		err := netns.Do(nsPath, true, func() error {
			links, err := nldump.Retry(netlink.LinkList)
			if err != nil {
				return err
			}
			for _, l := range links {
				a := l.Attrs()
				xdp := uint32(0)
				if a.Xdp != nil && a.Xdp.Attached {
					xdp = a.Xdp.ProgId
				}
				fmt.Fprintf(&b, "%s/%s %s flags=%v mtu=%d master=%d xdp=%d\n", n, a.Name, l.Type(), a.Flags&^net.FlagRunning, a.MTU, a.MasterIndex, xdp)
				qs, err := netlink.QdiscList(l)
				if err != nil {
					return err
				}
				for _, q := range qs {
					fmt.Fprintf(&b, "%s/%s qdisc %s %x parent %x\n", n, a.Name, q.Type(), q.Attrs().Handle, q.Attrs().Parent)
				}
				for _, o := range []ethtool.Offload{ethtool.GRO, ethtool.TxCsum, ethtool.RxCsum} {
					if on, err := ethtool.Get(a.Name, o); err == nil {
						fmt.Fprintf(&b, "%s/%s %s=%v\n", n, a.Name, o, on)
					}
				}
				sys := filepath.Join("/sys/class/net", a.Name)
				if v, err := os.ReadFile(filepath.Join(sys, "threaded")); err == nil {
					fmt.Fprintf(&b, "%s/%s threaded=%s\n", n, a.Name, strings.TrimSpace(string(v)))
				}
				rps, _ := filepath.Glob(filepath.Join(sys, "queues/rx-*/rps_cpus"))
				for _, q := range rps {
					v, _ := os.ReadFile(q)
					fmt.Fprintf(&b, "%s/%s %s=%s\n", n, a.Name, filepath.Base(filepath.Dir(q)), strings.TrimSpace(string(v)))
				}
				for _, dir := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
					fs, _ := netlink.FilterList(l, dir)
					for _, f := range fs {
						fmt.Fprintf(&b, "%s/%s filter %x %s prio %d\n", n, a.Name, dir, f.Type(), f.Attrs().Priority)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("snapshot %s: %v", n, err)
		}
	}
	return b.String()
}
