package experiments

import (
	"context"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestNodeSampleCountsTheSendersWire: a frame the remote host cannot hand
// to the node's wire is dropped by the remote's veth and counted there
// (tx_dropped on the sender, as when the node's 256-entry ring is full),
// and nowhere on the node: the bench's sample must read the remote's
// devices to see it.
func TestNodeSampleCountsTheSendersWire(t *testing.T) {
	testbedtest.RequireRoot(t)
	n, err := nodes.Build(nodes.Options{Kind: nodes.Flannel, Prefix: "rxsw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	e, err := newNodeEnv(n, testbed.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	key := "remote:" + n.Wire.RemoteDev
	before, err := e.sample()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := before.Links[key]; !ok {
		t.Fatalf("the sample has no %s: %v", key, before.Links)
	}
	// The node's end of the wire down: the remote's veth has nowhere to
	// put what it is given and drops it, as it does when that end's ring
	// is full.
	err = netns.Do(n.Netns, false, func() error {
		l, err := netlink.LinkByName(n.Wire.NodeDev)
		if err != nil {
			return err
		}
		return netlink.LinkSetDown(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	var res bench.InjectResult
	err = netns.Do(n.Remote, false, func() error {
		in, err := bench.NewInjector(n.Wire.RemoteDev, e.frame.Flows(1), 1, false)
		if err != nil {
			return err
		}
		defer in.Close()
		res = in.Run(context.Background(), 1000, 100*time.Millisecond, 0, nil)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := e.sample()
	if err != nil {
		t.Fatal(err)
	}
	dropped := func(dev string) uint64 {
		a, b := after.Links[dev], before.Links[dev]
		return (a.TxDropped + a.RxDropped) - (b.TxDropped + b.RxDropped)
	}
	tried := uint64(res.Sent + res.Failed)
	if tried == 0 || dropped(key) < tried {
		t.Errorf("%s counted %d drops for %d frames given to it (%+v)", key, dropped(key), tried, res)
	}
	// The node's own end counts none of them (a couple of its own
	// neighbour-discovery packets, dropped as it went down, at most).
	if x := dropped(n.Wire.NodeDev); x >= tried {
		t.Errorf("the node's wire %s counted %d drops for the %d frames the remote's dropped", n.Wire.NodeDev, x, tried)
	}
	t.Logf("%d frames given to the remote's wire: %s counted %d drops, the node's %s %d", tried, key, dropped(key), n.Wire.NodeDev, dropped(n.Wire.NodeDev))
}
