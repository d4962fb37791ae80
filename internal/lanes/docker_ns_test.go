package lanes

import (
	"bytes"
	"encoding/binary"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestLaneOnDockerOverlay enables the lane inside a Docker-overlay-like
// sandbox namespace, whose VXLAN device has no underlay there: the lane
// attaches to vxlan0 itself, a high-priority UDP flow from the remote
// container arrives intact and in order through it (rule counters count
// every datagram, veth0 never transmits them: the bridge and the backlog
// queue are skipped), a low-priority flow takes the bridge, queue mode is
// refused with the reason, and disable leaves the sandbox as it was.
func TestLaneOnDockerOverlay(t *testing.T) {
	requireBPF(t)
	remote, _, sandbox, ctr := testbedtest.DockerOverlay(t)
	opts := Options{Netns: sandbox, StateFile: filepath.Join(t.TempDir(), "datapath.json")}
	t.Cleanup(func() { Disable(opts) })
	var rules policy.Set
	r, _ := policy.Parse(policy.Spec{Dst: "10.77.0.2", Proto: "udp", Port: "7000"})
	if _, err := rules.Add(r); err != nil {
		t.Fatal(err)
	}

	q := opts
	q.Mode = ModeQueue
	if _, err := Enable(q, &rules); err == nil {
		t.Fatal("queue mode enabled without an underlay")
	}
	before := testbedtest.NetnsSnapshot(t, sandbox)
	topo, err := Enable(opts, &rules)
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if len(topo.Tunnels) != 1 || topo.Tunnels[0].Underlay != "" || topo.Tunnels[0].VNI != 4242 || topo.Tunnels[0].Routed {
		t.Fatalf("tunnels: %+v", topo.Tunnels)
	}
	if len(topo.Endpoints) != 1 || topo.Endpoints[0].Dev != "veth0" || !bytes.Equal(topo.Endpoints[0].MAC, testbedtest.DockerCtrMAC) {
		t.Fatalf("endpoints: %+v", topo.Endpoints)
	}
	if s := topo.Endpoints[0].Skip; s != "" {
		// Bridge netfilter is on on this machine: force, as the CLI's
		// --skip-netfilter would.
		t.Logf("endpoint refused without force: %s", s)
		opts.SkipNetfilter = true
		if _, err := Enable(opts, &rules); err != nil {
			t.Fatal(err)
		}
	}

	listen := func(ns string, port int) *net.UDPConn {
		var c *net.UDPConn
		if err := inNetns(ns, func() (err error) {
			c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
			return
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	hi, lo, tx := listen(ctr, 7000), listen(ctr, 7001), listen(remote, 0)
	send := func(rx *net.UDPConn, port, n int) {
		t.Helper()
		to := &net.UDPAddr{IP: net.IPv4(10, 77, 0, 2), Port: port}
		buf := make([]byte, 256)
		for i := range n {
			msg := pattern(100)
			binary.BigEndian.PutUint32(msg, uint32(i))
			if _, err := tx.WriteToUDP(msg, to); err != nil {
				t.Fatal(err)
			}
			rx.SetReadDeadline(time.Now().Add(5 * time.Second)) // bounds the test only
			k, _, err := rx.ReadFromUDP(buf)
			if err != nil {
				t.Fatalf("datagram %d to port %d: %v", i, port, err)
			}
			if !bytes.Equal(buf[:k], msg) {
				t.Fatalf("datagram %d to port %d arrived as %x", i, port, buf[:k])
			}
		}
	}
	vethTx := func() uint64 {
		var n uint64
		inNetns(sandbox, func() error {
			l, err := netlink.LinkByName("veth0")
			if err == nil {
				n = l.Attrs().Statistics.TxPackets
			}
			return err
		})
		return n
	}

	const n = 100
	tx0 := vethTx()
	send(hi, 7000, n)
	st, err := ReadStats(opts, &rules)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rules[0].Packets != n || st.High.Packets != n {
		t.Fatalf("lane counted %d (rule) / %d (high), want %d; fallbacks %v", st.Rules[0].Packets, st.High.Packets, n, st.Fallbacks)
	}
	if d := vethTx() - tx0; d > 5 {
		t.Fatalf("veth0 transmitted %d packets during the high-priority flow: the bridge was not skipped", d)
	}
	tx1 := vethTx()
	send(lo, 7001, n)
	if d := vethTx() - tx1; d < n {
		t.Fatalf("low-priority flow: veth0 transmitted %d packets, want >= %d", d, n)
	}
	if st, _ := ReadStats(opts, &rules); st.Fallbacks["no_match"] < n {
		t.Fatalf("low-priority flow counted no_match %d, want >= %d", st.Fallbacks["no_match"], n)
	}

	if err := Disable(opts); err != nil {
		t.Fatal(err)
	}
	if after := testbedtest.NetnsSnapshot(t, sandbox); after != before {
		t.Fatalf("sandbox changed by enable/disable:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	send(hi, 7000, 10) // the normal path still delivers
}
