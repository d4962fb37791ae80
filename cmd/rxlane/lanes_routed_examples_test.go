package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nodes"
)

// TestMain lets the test binary stand in for the rxlane command: with
// RXLANE_RUN_CLI=1 it runs main with the arguments after "--", so a test
// can run the CLI as a user would, as its own process inside a namespace
// (`ip netns exec NODE rxlane ...`).
func TestMain(m *testing.M) {
	if os.Getenv("RXLANE_RUN_CLI") == "1" {
		crashAt(os.Getenv("RXLANE_CRASH_AT"))
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"rxlane"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// cliIn returns the rxlane command line args run inside the named
// namespace, as `ip netns exec NAME rxlane ARGS` (which also gives it
// the namespace's sysfs), with its state under stateDir.
func cliIn(ns, stateDir string, args ...string) *exec.Cmd {
	self, _ := os.Executable()
	c := exec.Command("ip", append([]string{"netns", "exec", ns, self, "-test.run=^$", "--"}, args...)...)
	c.Env = append(os.Environ(), "RXLANE_RUN_CLI=1", "RXLANE_STATE_DIR="+stateDir)
	return c
}

// TestLanesRoutedExamples runs docs/lanes.md's Flannel/Calico example as
// written, inside the node's own namespace, with POD and P replaced by a
// fresh Flannel-shaped node's pod address and port 7000: enable must load
// the rule without a warning, every datagram the remote sends to the pod
// must go via the lane from the first, and watch must run until
// interrupted. The wire is made NIC-like (the remote computes outer UDP
// checksums, the node's GRO verifies them), so no --trust-outer-csum is
// needed, as on a node with a NIC.
func TestLanesRoutedExamples(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root for namespaces and BPF")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: iproute2's ip is not installed")
	}
	var block []string
	for _, b := range docExamples(t, "docs/lanes.md", "## Using it") {
		if strings.Contains(strings.Join(b, "\n"), "POD") {
			block = b
		}
	}
	if len(block) < 3 {
		t.Fatalf("no routed example with POD in docs/lanes.md: %q", block)
	}
	n, err := nodes.Build(nodes.Options{Kind: nodes.Flannel, Prefix: "rxcl"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	// A NIC-like wire: the remote computes outer checksums (as a NIC
	// sender puts them on the wire) and the node's GRO verifies them (as
	// a NIC's receive offload does).
	if _, err := ethtool.SetIn(n.Remote, n.Wire.RemoteDev, ethtool.TxCsum, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ethtool.SetIn(n.Netns, n.Wire.NodeDev, ethtool.GRO, true); err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	nodeNS := filepath.Base(n.Netns)
	t.Cleanup(func() { cliIn(nodeNS, stateDir, "lanes", "disable").Run() })
	pod := n.Pods[0]
	podAddr := pod.Addrs[0]

	for _, ex := range block {
		ex = strings.ReplaceAll(strings.ReplaceAll(ex, "POD", podAddr.String()), "--port P", "--port 7000")
		args := strings.Fields(ex)[1:]
		if args[0] == "lanes" && args[1] == "watch" {
			runWatch(t, cliIn(nodeNS, stateDir, args...))
			continue
		}
		out, err := cliIn(nodeNS, stateDir, args...).CombinedOutput()
		t.Logf("$ %s\n%s", ex, out)
		if err != nil {
			t.Fatalf("%s: %v", ex, err)
		}
		if args[1] != "enable" {
			continue
		}
		if !strings.Contains(string(out), "rules: 1 loaded") || strings.Contains(string(out), "warning:") {
			t.Fatalf("enable: want the rule loaded and no warning:\n%s", out)
		}
		sendToPod(t, n, pod, podAddr, 100)
		out, err = cliIn(nodeNS, stateDir, "lanes", "stats", "--json").Output()
		if err != nil {
			t.Fatal(err)
		}
		var st lanes.Stats
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("stats: %v\n%s", err, out)
		}
		if len(st.Rules) != 1 || st.Rules[0].Packets != 100 || len(st.Warnings) != 0 {
			t.Fatalf("want all 100 datagrams via the lane and no warning: %s", out)
		}
	}
}

// sendToPod sends n datagrams from the remote's inner address to the
// pod's port 7000, one at a time, and requires each to arrive.
func sendToPod(t *testing.T, n *nodes.Node, pod nodes.Pod, dst netip.Addr, count int) {
	t.Helper()
	var rx, tx *net.UDPConn
	if err := netns.Do(pod.Netns, false, func() (err error) {
		rx, err = net.ListenUDP("udp", &net.UDPAddr{Port: 7000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var src netip.Addr
	for _, a := range n.RemoteInner() {
		if a.Is4() == dst.Is4() && !src.IsValid() {
			src = a
		}
	}
	if err := netns.Do(n.Remote, false, func() (err error) {
		tx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 64)
	for i := range count {
		if _, err := tx.WriteToUDPAddrPort([]byte(fmt.Sprint(i)), netip.AddrPortFrom(dst, 7000)); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := rx.ReadFromUDP(buf); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
	}
}

// runWatch starts `lanes watch`, waits for its first sync line, then
// interrupts it as Ctrl-C would and requires a clean exit.
func runWatch(t *testing.T, c *exec.Cmd) {
	t.Helper()
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.Stderr = os.Stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // ip netns exec execs the CLI: one group to signal
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if !ok || !strings.Contains(l, "synced: 1 tunnels") {
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			c.Wait()
			t.Fatalf("watch: first line %q, want its first sync", l)
		}
		t.Logf("$ rxlane lanes watch\n%s", l)
	case <-time.After(20 * time.Second):
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		c.Wait()
		t.Fatal("watch printed no sync")
	}
	syscall.Kill(-c.Process.Pid, syscall.SIGINT)
	for range lines {
	}
	if err := c.Wait(); err != nil {
		t.Fatalf("watch after Ctrl-C: %v", err)
	}
}
