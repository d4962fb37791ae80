package cni

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/rxlane/rxlane/internal/workload"
)

// podmanTest is Debian's podman (4.3, CNI network backend) with
// everything of its own in the test's directory: storage (vfs), run
// state, containers.conf (CONTAINERS_CONF), the network configuration
// directory with a conflist chaining bridge + host-local and
// rxlane-cni, the plugin path (the test's rxlane-cni, Debian's
// plugins). It runs in a namespace of the test, so the bridge and the
// containers' veths are made there.
type podmanTest struct {
	t   *testing.T
	dir string
	ns  string
	env []string
}

func newPodmanTest(t *testing.T) *podmanTest {
	testbedtest.RequireRoot(t)
	for _, bin := range []string{"podman", "runc", "conmon"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err := os.Stat("/usr/libexec/podman/" + bin); err != nil {
				t.Skipf("skipping: %s not installed (run scripts/setup)", bin)
			}
		}
	}
	if !slices.ContainsFunc(debianCNI, func(d string) bool { _, err := os.Stat(filepath.Join(d, "bridge")); return err == nil }) {
		t.Skip("skipping: CNI plugin bridge not installed (run scripts/setup)")
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil || exec.Command("ldd", busybox).Run() == nil {
		t.Skip("skipping: no static busybox for the image (run scripts/setup)")
	}
	p := &podmanTest{t: t, dir: t.TempDir(), ns: testbedtest.NewNamedNS(t, "rxcni-podman")}
	plugin := buildPlugin(t)
	d := p.dir
	for _, sub := range []string{"net.d", "state", "ipam", "rootfs/bin"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf(`[network]
network_backend = "cni"
cni_plugin_dirs = [%q, "/usr/lib/cni", "/opt/cni/bin"]
network_config_dir = %q
default_network = "rxnet"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
`, plugin, filepath.Join(d, "net.d"))
	list := fmt.Sprintf(`{"cniVersion":"0.4.0","name":"rxnet","plugins":[
 {"type":"bridge","bridge":"rxpod0","isGateway":true,"ipMasq":false,
  "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.89.7.0/24","gateway":"10.89.7.1"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"rxlane-cni","socket":%q,"stateDir":%q}]}`, filepath.Join(d, "ipam"), filepath.Join(d, "sock", "agent.sock"), filepath.Join(d, "state"))
	for name, body := range map[string]string{"containers.conf": conf, "net.d/rxnet.conflist": list} {
		if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p.env = append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(d, "containers.conf"))
	// podman keeps two things outside its --root whatever it is told:
	// the image blob cache and libcni's result cache (whose entries
	// its DEL removes). Made by this test, they go with it (only
	// what is empty once ours is gone: another user's stays).
	for _, c := range [][]string{
		{"/var/lib/containers/cache/blob-info-cache-v1.boltdb", "/var/lib/containers/cache", "/var/lib/containers"},
		{"/var/lib/cni/results", "/var/lib/cni"},
	} {
		if _, err := os.Stat(c[len(c)-1]); os.IsNotExist(err) {
			t.Cleanup(func() {
				for _, path := range c {
					os.Remove(path)
				}
			})
		}
	}
	t.Cleanup(p.cleanup)
	// The image: a busybox-static root filesystem, imported (nothing
	// pulled).
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "rootfs/bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"sh", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(d, "rootfs/bin", l)); err != nil {
			t.Fatal(err)
		}
	}
	tar := filepath.Join(d, "rootfs.tar")
	if out, err := exec.Command("tar", "-C", filepath.Join(d, "rootfs"), "-cf", tar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	p.podman(nil, "import", tar, "localhost/rxlane-busybox:test")
	return p
}

// podman runs podman with the test's storage and configuration in the
// test's namespace, env added to its environment; it fails the test on
// an error and returns the output.
func (p *podmanTest) podman(env []string, args ...string) string {
	p.t.Helper()
	out, err := p.run(env, args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

func (p *podmanTest) run(env []string, args ...string) (string, error) {
	d := p.dir
	full := append([]string{"--root", filepath.Join(d, "root"), "--runroot", filepath.Join(d, "run"),
		"--storage-driver", "vfs", "--tmpdir", filepath.Join(d, "tmp")}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out []byte
	err := netns.Do(p.ns, false, func() (err error) {
		cmd := exec.CommandContext(ctx, "podman", full...)
		cmd.Env = append(slices.Clone(p.env), env...)
		out, err = cmd.CombinedOutput()
		return err
	})
	return string(out), err
}

// cleanup removes every container (podman's CNI DEL, its namespaces in
// /run/netns, conmon), then whatever podman left mounted in the test's
// directory.
func (p *podmanTest) cleanup() {
	if out, err := p.run(nil, "rm", "--all", "--force", "--time", "0"); err != nil {
		p.t.Errorf("podman rm: %v\n%s", err, out)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && strings.HasPrefix(fs[4], p.dir+"/") {
			mounts = append(mounts, fs[4])
		}
	}
	slices.Reverse(mounts)
	for _, m := range mounts {
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// runCtr starts a container sleeping, with env for podman (its CNI_ARGS
// go to the plugins), and returns its ID and address.
func (p *podmanTest) runCtr(name string, env []string) (string, netip.Addr) {
	p.t.Helper()
	// The ulimits: this machine refuses podman's defaults (raising
	// nofile and nproc to their maximum).
	id := p.podman(env, "run", "--detach", "--name", name, "--network", "rxnet",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "localhost/rxlane-busybox:test", "sleep", "600")
	ip := p.podman(nil, "inspect", name, "--format", "{{.NetworkSettings.Networks.rxnet.IPAddress}}")
	a, err := netip.ParseAddr(ip)
	if err != nil {
		p.t.Fatalf("container %s: address %q: %v", name, ip, err)
	}
	return id, a
}

// TestPodman starts containers with Debian's podman on a network whose
// conflist chains rxlane-cni: one asking for the lane (CNI_ARGS, which
// podman passes to the plugins) while no agent runs starts, and the
// agent finds its request when it starts; a plain one gets none;
// removing the first removes its request.
func TestPodman(t *testing.T) {
	p := newPodmanTest(t)
	lane := []string{"CNI_ARGS=" + ArgLane + "=high;" + ArgPorts + "=7000;" + ArgProto + "=udp"}
	hiID, hiAddr := p.runCtr("hi", lane)
	want := workload.Workload{Source: workload.SourceCNI, ID: hiID + "/eth0", Name: "hi", IPs: []netip.Addr{hiAddr}, Lane: "high", Ports: "7000", Proto: "udp"}

	// The agent's lane: a VXLAN device on a veth underlay in the
	// test's namespace (the agent needs a lane that takes workloads;
	// no traffic is sent here, TestChain does that).
	if err := netns.Do(p.ns, false, func() error {
		ul := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: "ul1"}
		if err := netlink.LinkAdd(ul); err != nil {
			return err
		}
		if l, err := netlink.LinkByName("ul0"); err != nil {
			return err
		} else {
			ul.Index = l.Attrs().Index
		}
		addr, _ := netlink.ParseAddr("198.18.201.1/24")
		if err := netlink.AddrAdd(ul, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(ul); err != nil {
			return err
		}
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan0"}, VxlanId: 4243, VtepDevIndex: ul.Attrs().Index,
			SrcAddr: addr.IP, Port: 4789}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		return netlink.LinkSetUp(vx)
	}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(p.dir, "agent.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf("state_dir: %s/state\nsocket: %s/sock/agent.sock\nlanes:\n  - netns: %s\n    trust_outer_csum: true\n    workloads: true\n", p.dir, p.dir, p.ns)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := agent.LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agent.Cleanup(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Errorf("agent cleanup: %v", err)
		}
	})
	c := &chainTest{t: t, file: file, cfg: cfg}
	c.startAgent()
	if got := c.agent.Workloads(); len(got) != 1 || !sameWorkload(got[0], want) {
		t.Fatalf("workloads after the agent started: %+v, want %+v", got, want)
	}

	_, plainAddr := p.runCtr("plain", nil)
	if got := c.agent.Workloads(); len(got) != 1 || got[0].Key() != want.Key() {
		t.Fatalf("workloads with the plain container %s: %+v, want only %s", plainAddr, got, want.Key())
	}
	p.podman(nil, "rm", "--force", "--time", "0", "hi")
	if got := c.agent.Workloads(); len(got) != 0 {
		t.Fatalf("workloads after podman rm: %+v", got)
	}
	p.podman(nil, "rm", "--force", "--time", "0", "plain")
	if ents, _ := os.ReadDir(workload.PendingDir(cfg.AgentDir())); len(ents) != 0 {
		t.Errorf("pending records left: %v", ents)
	}
}
