package testbed_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/labns"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/vishvananda/netns"
)

// leftovers lists namespaces and state files carrying the prefix.
func leftovers(t *testing.T, prefix string) []string {
	t.Helper()
	var out []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, e.Name())
		}
	}
	if _, err := os.Stat(labns.Dir + "/" + prefix + ".json"); err == nil {
		out = append(out, "state file")
	}
	return out
}

func TestUpDownLeavesNothing(t *testing.T) {
	c := testbedtest.Config(t)
	if err := testbed.Up(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	st, err := testbed.GetStatus(c)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Healthy() {
		t.Fatalf("fresh testbed unhealthy: %v", st.Problems)
	}
	if err := testbed.Down(c.Prefix); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, c.Prefix); len(l) > 0 {
		t.Fatalf("left behind: %v", l)
	}
	// Down is safe to repeat.
	if err := testbed.Down(c.Prefix); err != nil {
		t.Fatalf("second down: %v", err)
	}
}

func TestUpIsIdempotentAndRepairs(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	if err := testbed.Up(context.Background(), c); err != nil {
		t.Fatalf("second up: %v", err)
	}
	// A different configuration over a running testbed is refused.
	d := c
	d.VNI = 7
	if err := testbed.Up(context.Background(), d); err == nil {
		t.Fatal("up with another VNI over a running testbed succeeded")
	}
	// Break it: remove a container's namespace; up notices and rebuilds.
	if err := netns.DeleteNamed(c.NS(testbed.CtrB)); err != nil {
		t.Fatal(err)
	}
	if st, _ := testbed.GetStatus(c); st.Healthy() {
		t.Fatal("status healthy with ctrB gone")
	}
	if err := testbed.Up(context.Background(), c); err != nil {
		t.Fatalf("repairing up: %v", err)
	}
	if st, err := testbed.GetStatus(c); err != nil || !st.Healthy() {
		t.Fatalf("after repair: %v %v", err, st.Problems)
	}
}

func TestFailedUpLeavesNothing(t *testing.T) {
	steps := []string{"loopback", "wire", "host A overlay", "host B overlay", "wire offloads", "receive-core layout", "state"}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			c := testbedtest.Config(t)
			t.Setenv("RXLANE_TESTBED_FAIL_AFTER", step)
			err := testbed.Up(context.Background(), c)
			if err == nil || !strings.Contains(err.Error(), "injected failure") {
				t.Fatalf("up with failure after %q: got %v", step, err)
			}
			if l := leftovers(t, c.Prefix); len(l) > 0 {
				t.Fatalf("failure after %q left behind: %v", step, l)
			}
		})
	}
}

func TestCancelledUpLeavesNothing(t *testing.T) {
	c := testbedtest.Config(t)
	ctx, cancel := context.WithCancel(context.Background())
	testbed.SetAfterStepForTest(t, func(step string) error {
		if step == "host A overlay" {
			cancel() // as Ctrl-C would, in the middle of up
		}
		return nil
	})
	err := testbed.Up(ctx, c)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled up: got %v, want context.Canceled", err)
	}
	if l := leftovers(t, c.Prefix); len(l) > 0 {
		t.Fatalf("cancelled up left behind: %v", l)
	}
}

// echo starts a UDP echo server inside node n and returns its socket.
func echo(t *testing.T, c testbed.Config, n testbed.Node, addr string) *net.UDPConn {
	t.Helper()
	var srv *net.UDPConn
	err := testbed.Do(c, n, func() error {
		a, _ := net.ResolveUDPAddr("udp4", addr)
		var err error
		srv, err = net.ListenUDP("udp4", a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := srv.ReadFromUDP(buf)
			if err != nil {
				return
			}
			srv.WriteToUDP(buf[:k], from)
		}
	}()
	t.Cleanup(func() { srv.Close() })
	return srv
}

// roundTrip sends one datagram from node n to dst and waits for the echo.
func roundTrip(t *testing.T, c testbed.Config, n testbed.Node, dst string) error {
	t.Helper()
	var cl *net.UDPConn
	err := testbed.Do(c, n, func() error {
		a, _ := net.ResolveUDPAddr("udp4", dst)
		var err error
		cl, err = net.DialUDP("udp4", nil, a)
		return err
	})
	if err != nil {
		return err
	}
	defer cl.Close()
	msg := []byte("rxlane-probe")
	buf := make([]byte, 64)
	// The first datagram may be lost while ARP resolves; retry a few times.
	for i := 0; i < 5; i++ {
		if _, err := cl.Write(msg); err != nil {
			return err
		}
		cl.SetReadDeadline(time.Now().Add(time.Second))
		k, err := cl.Read(buf)
		if err == nil && bytes.Equal(buf[:k], msg) {
			return nil
		}
	}
	return errors.New("no echo")
}

func TestReachability(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	echo(t, c, testbed.CtrB, "198.19.0.2:7001")
	echo(t, c, testbed.HostB, "198.18.0.2:7002")
	if err := roundTrip(t, c, testbed.CtrA, "198.19.0.2:7001"); err != nil {
		t.Errorf("overlay ctrA -> ctrB: %v", err)
	}
	if err := roundTrip(t, c, testbed.HostA, "198.18.0.2:7002"); err != nil {
		t.Errorf("host path hostA -> hostB: %v", err)
	}
	// The overlay really is encapsulated: vxB has received what ctrB got.
	st, err := testbed.GetStatus(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		for _, l := range n.Links {
			if l.Name == testbed.WireB {
				if !l.Offloads[testbed.OffloadGRO] || l.Offloads[testbed.OffloadTSO] {
					t.Errorf("wireB offloads %v, want gro on, tso off", l.Offloads)
				}
				if l.RPSCPUs != "2" {
					t.Errorf("wireB rps_cpus %q, want 2 (rx-cpu 1)", l.RPSCPUs)
				}
			}
		}
	}
}

func TestTwoTestbedsCoexist(t *testing.T) {
	a := testbedtest.Up(t, testbedtest.Config(t))
	b := a
	b.Prefix = testbedtest.Prefix()
	b = testbedtest.Up(t, b)
	echo(t, b, testbed.CtrB, "198.19.0.2:7003")
	if err := roundTrip(t, b, testbed.CtrA, "198.19.0.2:7003"); err != nil {
		t.Fatal(err)
	}
	if err := testbed.Down(b.Prefix); err != nil {
		t.Fatal(err)
	}
	st, err := testbed.GetStatus(a)
	if err != nil || !st.Healthy() {
		t.Fatalf("removing one testbed disturbed the other: %v %v", err, st.Problems)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*testbed.Config)
		want string
	}{
		{"prefix", func(c *testbed.Config) { c.Prefix = "Bad-Prefix" }, "prefix"},
		{"long prefix", func(c *testbed.Config) { c.Prefix = "abcdefghijklmn" }, "prefix"},
		{"vni", func(c *testbed.Config) { c.VNI = 1 << 24 }, "vni"},
		{"port", func(c *testbed.Config) { c.Port = 0 }, "port"},
		{"layout", func(c *testbed.Config) { c.Layout = "fast" }, "layout"},
		{"rx-cpu", func(c *testbed.Config) { c.RxCPU = 4096 }, "rx-cpu"},
		{"nic rx-cpu", func(c *testbed.Config) { c.Layout, c.RxCPU = testbed.LayoutNIC, 4096 }, "rx-cpu"},
		{"nic same cpus", func(c *testbed.Config) { c.Layout, c.AppCPU, c.RxCPU = testbed.LayoutNIC, 1, 1 }, "app-cpu"},
	} {
		c := testbed.Defaults()
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want error about %s", tc.name, err, tc.want)
		}
	}
	if err := testbed.Defaults().Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	if c := testbed.LabDefaults(); c.Layout != testbed.LayoutNIC || c.Validate() != nil {
		t.Errorf("lab defaults: layout %s, %v; want nic, valid", c.Layout, c.Validate())
	}
}
