package realnode

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nldump"
	"github.com/rxlane/rxlane/internal/nodes"
)

// The swarm's wire: the remote (manager) host is .1, the receiving
// (worker) node .2, on eth0 of each, as two Docker hosts on one LAN.
var (
	swarmRemoteAddr = netip.MustParsePrefix("198.19.77.1/24")
	swarmNodeAddr   = netip.MustParsePrefix("198.19.77.2/24")
)

// SwarmImage is the image Up builds on both engines by `docker import`
// of a root filesystem holding only the static busybox (Debian's
// busybox-static): nothing is pulled.
const SwarmImage = "rxlane/busybox:swarm"

// DefaultSwarmSubnet is the overlay network's subnet unless
// SwarmOptions.Subnet says otherwise.
var DefaultSwarmSubnet = netip.MustParsePrefix("10.199.0.0/24")

// SwarmOptions say what Up builds.
type SwarmOptions struct {
	// Prefix starts the names of the hosts' namespaces (PREFIX<id>-node,
	// PREFIX<id>-remote in /run/netns), of the daemons' directory
	// (/tmp/PREFIX<id>), the overlay network and the containers;
	// default "rxsw".
	Prefix string
	// Containers is how many containers Up starts on the receiving
	// node: 0 means 1, negative none (add them with AddContainer).
	Containers int
	// Subnet is the overlay network's; default DefaultSwarmSubnet.
	Subnet netip.Prefix
	// NoIptables starts the daemons with --iptables=false. By default
	// they manage iptables as a stock engine does: their rules live in
	// the hosts' namespaces only, and go with them.
	NoIptables bool
	// Log, if set, gets one line per step.
	Log io.Writer
}

// Engine is one Docker engine (dockerd and the containerd it manages)
// running in its host's network namespace, with every directory of its
// own: nothing of it lives in the host's /var/lib/docker, /run/docker or
// /run/docker.sock.
type Engine struct {
	Name  string // "node" or "remote"
	Netns string // the host's namespace file (/run/netns/...)
	Dev   string // the host's wire device: eth0
	Addr  netip.Prefix
	MAC   net.HardwareAddr
	// DataRoot, ExecRoot, Socket, PidFile and Log are dockerd's
	// --data-root, --exec-root, -H unix://, --pidfile and its output.
	// Docker's namespace files (overlay sandboxes 1-<id>, containers)
	// are in ExecRoot/netns.
	DataRoot, ExecRoot, Socket, PidFile, Log string
	// CgroupParent is dockerd's --cgroup-parent: the containers'
	// cgroups, removed by Close.
	CgroupParent string
	// SwarmNodeID is the engine's node in the swarm.
	SwarmNodeID string

	dir    string
	args   []string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// NetnsDir is where the engine keeps its namespace files.
func (e *Engine) NetnsDir() string { return filepath.Join(e.ExecRoot, "netns") }

// Container is a container on the overlay network.
type Container struct {
	Name    string
	ID      string
	Netns   string // its namespace file: the engine's ExecRoot/netns/<12 hex>
	Dev     string // its interface on the overlay
	Addr    netip.Addr
	MAC     net.HardwareAddr
	HostDev string // the other end of Dev: vethN on br0 in the sandbox
}

// Swarm is two engines in a swarm, joined by a veth wire, with an
// attachable overlay network, a container on the remote host to send
// from and containers on the receiving node.
type Swarm struct {
	ID string
	// Node is the receiving host (a swarm worker), Remote the sending
	// one (the manager).
	Node, Remote *Engine
	// Network is the overlay network's name, NetworkID its ID, VNI and
	// Port its VXLAN identifier and UDP port.
	Network, NetworkID string
	VNI, Port          int
	// Sandbox is the node's sandbox namespace file of the overlay
	// network (Node.ExecRoot/netns/1-<network id>): the bridge br0,
	// vxlan0 and the containers' veths. RemoteSandbox is the remote's.
	Sandbox, RemoteSandbox string
	// Sender is the remote host's container on the overlay: send from
	// its namespace to reach the node's containers over the wire.
	Sender Container
	// Containers are the node's containers, in the order added.
	Containers []Container

	opts      SwarmOptions
	dir       string
	docker    string // the docker client
	image     []byte // the image's tar
	mu        sync.Mutex
	created   []string // namespace files
	madeRunCD []string // /run/containerd dirs Up created (the shims' sockets)
	seq       int
	closed    bool
}

// Binaries are the programs a swarm needs: the engine (dockerd,
// containerd, its runc shim, runc), the client, and busybox for the
// image.
var swarmBinaries = []string{"dockerd", "containerd", "containerd-shim-runc-v2", "runc", "docker", "busybox"}

// MissingBinaries lists the programs Up needs that this machine lacks
// (scripts/setup-docker installs them).
func MissingBinaries() []string {
	var out []string
	for _, b := range swarmBinaries {
		if _, err := lookPath(b); err != nil {
			out = append(out, b)
		}
	}
	return out
}

// lookPath finds a program in PATH or the sbin directories PATH may
// lack.
func lookPath(name string) (string, error) {
	if name == "docker" {
		// The engine's own client before any other (a newer client
		// in /usr/local/bin negotiates too, but is not the package's).
		if _, err := os.Stat("/usr/bin/docker"); err == nil {
			return "/usr/bin/docker", nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (scripts/setup-docker installs it)", name)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Swarm) logf(format string, args ...any) {
	if s.opts.Log != nil {
		fmt.Fprintf(s.opts.Log, "swarm %s: %s\n", s.ID, fmt.Sprintf(format, args...))
	}
}

// Up builds the swarm: two fresh namespaces joined by a veth wire, an
// engine in each (own data and exec roots, socket, pidfile, containerd),
// the remote's engine initialising a swarm on its wire address and the
// node's joining it, the image imported on both, an attachable overlay
// network, the sender container on the remote and opts.Containers on the
// node. It returns when the sender's host knows every node container on
// the overlay and the node is quiet (settle). On an error, everything built so far is removed.
func Up(ctx context.Context, o SwarmOptions) (*Swarm, error) {
	if o.Prefix == "" {
		o.Prefix = "rxsw"
	}
	if !o.Subnet.IsValid() {
		o.Subnet = DefaultSwarmSubnet
	}
	if m := MissingBinaries(); len(m) > 0 {
		return nil, fmt.Errorf("swarm: missing %s (run scripts/setup-docker)", strings.Join(m, ", "))
	}
	s := &Swarm{ID: randHex(4), opts: o, Port: 4789}
	s.docker, _ = lookPath("docker")
	if err := s.up(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("swarm up: %w", err), s.Close())
	}
	return s, nil
}

// swarmTestHook, when set by a test, runs at each step of Up and fails
// it with its error.
var swarmTestHook func(step string) error

func (s *Swarm) step(name string) error {
	if swarmTestHook != nil {
		return swarmTestHook(name)
	}
	return nil
}

func (s *Swarm) name(suffix string) string { return s.opts.Prefix + s.ID + "-" + suffix }

func (s *Swarm) up(ctx context.Context) error {
	s.dir = filepath.Join(os.TempDir(), s.opts.Prefix+s.ID)
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return err
	}
	for _, d := range []string{"/run/containerd", "/run/containerd/s"} {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			s.madeRunCD = append(s.madeRunCD, d)
		}
	}
	var err error
	s.image, err = busyboxTar()
	if err != nil {
		return err
	}
	s.Remote, err = s.newEngine("remote", swarmRemoteAddr)
	if err != nil {
		return err
	}
	s.Node, err = s.newEngine("node", swarmNodeAddr)
	if err != nil {
		return err
	}
	if err := s.wire(); err != nil {
		return err
	}
	for _, e := range []*Engine{s.Remote, s.Node} {
		s.logf("starting dockerd (%s) in %s", e.Name, e.Netns)
		if err := e.start(ctx, s.docker); err != nil {
			return err
		}
	}
	a := s.Remote.Addr.Addr().String()
	if _, err := s.Remote.Docker(ctx, nil, "swarm", "init", "--advertise-addr", a, "--listen-addr", a+":2377"); err != nil {
		return err
	}
	tok, err := s.Remote.Docker(ctx, nil, "swarm", "join-token", "-q", "worker")
	if err != nil {
		return err
	}
	b := s.Node.Addr.Addr().String()
	if _, err := s.Node.Docker(ctx, nil, "swarm", "join", "--token", strings.TrimSpace(tok), "--advertise-addr", b, "--listen-addr", b+":2377", a+":2377"); err != nil {
		return err
	}
	for _, e := range []*Engine{s.Remote, s.Node} {
		id, err := e.Docker(ctx, nil, "info", "--format", "{{.Swarm.NodeID}}")
		if err != nil {
			return err
		}
		e.SwarmNodeID = strings.TrimSpace(id)
		if _, err := e.Docker(ctx, bytes.NewReader(s.image), "import", "-c", `CMD ["/bin/sh"]`, "-", SwarmImage); err != nil {
			return err
		}
	}
	s.logf("swarm of %s (manager) and %s (worker)", s.Remote.SwarmNodeID, s.Node.SwarmNodeID)
	if err := s.step("network"); err != nil {
		return err
	}
	s.Network = s.name("ov")
	id, err := s.Remote.Docker(ctx, nil, "network", "create", "-d", "overlay", "--attachable", "--subnet", s.opts.Subnet.String(), s.Network)
	if err != nil {
		return err
	}
	s.NetworkID = strings.TrimSpace(id)
	if s.Sender, err = s.run(ctx, s.Remote, s.name("sender")); err != nil {
		return err
	}
	if s.RemoteSandbox, err = s.sandboxOf(ctx, s.Remote); err != nil {
		return err
	}
	if err := s.step("containers"); err != nil {
		return err
	}
	n := s.opts.Containers
	if n == 0 {
		n = 1
	}
	for range max(n, 0) {
		if _, err := s.addContainer(ctx); err != nil {
			return err
		}
	}
	if s.Sandbox == "" {
		return nil
	}
	return s.settle(ctx)
}

// newEngine lays out an engine's directories and creates its host's
// namespace.
func (s *Swarm) newEngine(name string, addr netip.Prefix) (*Engine, error) {
	// Short paths: the exec root holds unix sockets (containerd's,
	// libnetwork's <64 hex>.sock), whose paths may not pass 107 bytes.
	d := filepath.Join(s.dir, name[:1])
	e := &Engine{Name: name, Dev: "eth0", Addr: addr, dir: d,
		DataRoot: filepath.Join(d, "data"), ExecRoot: filepath.Join(d, "x"),
		Socket: filepath.Join(d, "docker.sock"), PidFile: filepath.Join(d, "docker.pid"), Log: filepath.Join(d, "dockerd.log"),
		CgroupParent: "/" + s.name(name)}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, err
	}
	p, err := nodes.NewNetns(nodes.RunNetnsDir, s.name(name))
	if err != nil {
		return nil, err
	}
	s.created = append(s.created, p)
	e.Netns = p
	// The engine's trust key (its "ID" in docker info) in its own
	// directory, not /etc/docker/key.json, which both engines would
	// share (a setting of the configuration file only).
	conf := fmt.Sprintf(`{"deprecated-key-path": %q}`, filepath.Join(d, "key.json"))
	if err := os.WriteFile(filepath.Join(d, "daemon.json"), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	e.args = []string{
		"--data-root", e.DataRoot, "--exec-root", e.ExecRoot, "--pidfile", e.PidFile,
		"-H", "unix://" + e.Socket, "--config-file", filepath.Join(d, "daemon.json"),
		// vfs: no overlayfs mounts (the image is one small layer).
		"--storage-driver", "vfs",
		"--cgroup-parent", e.CgroupParent,
		"--iptables=" + strconv.FormatBool(!s.opts.NoIptables), "--ip6tables=false",
		"--userland-proxy=false", "--shutdown-timeout", "3",
	}
	return e, nil
}

// wire joins the hosts by a veth pair, eth0 in each, with their
// addresses.
func (s *Swarm) wire() error {
	h, err := vnetns.GetFromPath(s.Node.Netns)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := netns.Do(s.Remote.Netns, false, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.Remote.Dev}, PeerName: s.Node.Dev, PeerNamespace: netlink.NsFd(h)}); err != nil {
			return fmt.Errorf("add wire: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, e := range []*Engine{s.Remote, s.Node} {
		if err := netns.Do(e.Netns, false, func() error {
			for _, dev := range []string{"lo", e.Dev} {
				l, err := netlink.LinkByName(dev)
				if err != nil {
					return err
				}
				if dev == e.Dev {
					e.MAC = l.Attrs().HardwareAddr
					a := &netlink.Addr{IPNet: &net.IPNet{IP: e.Addr.Addr().AsSlice(), Mask: net.CIDRMask(e.Addr.Bits(), 32)}}
					if err := netlink.AddrAdd(l, a); err != nil {
						return fmt.Errorf("address %s: %w", e.Addr, err)
					}
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("%s: %w", e.Name, err)
		}
	}
	return nil
}

// start starts dockerd in the engine's namespace (it starts its own
// containerd under ExecRoot/containerd) and waits until it answers.
func (e *Engine) start(ctx context.Context, docker string) error {
	bin, err := lookPath("dockerd")
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(e.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, e.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: not in the test's process group (a ^C goes to
	// the test, whose cleanup stops the daemon). No parent-death
	// signal: it would follow the forking thread, not the process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/sbin:/sbin:/usr/bin:/bin")
	// The child inherits the forking thread's network namespace (and
	// the caller's mount namespace: the netns files dockerd mounts
	// under ExecRoot are visible to rxlane).
	if err := netns.Do(e.Netns, false, cmd.Start); err != nil {
		return fmt.Errorf("start dockerd (%s): %w", e.Name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	e.mu.Lock()
	e.cmd, e.exited = cmd, exited
	e.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := e.docker(c, docker, nil, "version", "--format", "{{.Server.Version}}")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("dockerd (%s) exited: %s", e.Name, e.logTail())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dockerd (%s) does not answer after 60s: %w: %s", e.Name, err, e.logTail())
		}
		time.Sleep(100 * time.Millisecond) // polls the daemon's socket with a deadline
	}
}

// logTail is the end of dockerd's output, for errors.
func (e *Engine) logTail() string {
	b, _ := os.ReadFile(e.Log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var keep []string
	for _, l := range lines {
		if strings.Contains(l, "level=error") || strings.Contains(l, "level=fatal") || !strings.Contains(l, "level=") {
			keep = append(keep, l)
		}
	}
	if len(keep) > 8 {
		keep = keep[len(keep)-8:]
	}
	return strings.Join(keep, "\n")
}

// PID is dockerd's process ID (0 when it is not running).
func (e *Engine) PID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd == nil || e.cmd.Process == nil {
		return 0
	}
	select {
	case <-e.exited:
		return 0
	default:
	}
	return e.cmd.Process.Pid
}

// DaemonPIDs are both engines' dockerd and the containerd each started
// (its child), running: what runs beside a measurement on the swarm
// node and a hand-built one has not. The containers' shims are left
// out: stopping them would stop nothing the measurement waits on, and
// they are not daemons of the node.
func (s *Swarm) DaemonPIDs() []int {
	var out []int
	for _, e := range []*Engine{s.Node, s.Remote} {
		if e == nil {
			continue // Close of a failed Up
		}
		pid := e.PID()
		if pid == 0 {
			continue
		}
		out = append(out, pid)
		for _, c := range childPIDs(pid) {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c)); err == nil && strings.TrimSpace(string(b)) == "containerd" {
				out = append(out, c)
			}
		}
	}
	return out
}

// childPIDs are the children of pid (from every thread's children list).
func childPIDs(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil && !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// Docker runs the docker client against this engine and returns its
// standard output.
func (e *Engine) Docker(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	docker, err := lookPath("docker")
	if err != nil {
		return "", err
	}
	return e.docker(ctx, docker, stdin, args...)
}

func (e *Engine) docker(ctx context.Context, docker string, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, docker, append([]string{"-H", "unix://" + e.Socket}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+filepath.Join(e.dir, "client"))
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("docker %s (%s): %w: %s", strings.Join(args, " "), e.Name, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// stop stops dockerd: SIGTERM, then SIGKILL after a bounded wait.
func (e *Engine) stop() error {
	e.mu.Lock()
	cmd, exited := e.cmd, e.exited
	e.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-exited:
		return nil
	case <-time.After(30 * time.Second):
	}
	cmd.Process.Kill()
	select {
	case <-exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("dockerd (%s, pid %d) did not exit after SIGKILL", e.Name, cmd.Process.Pid)
	}
}

// busyboxTar is a root filesystem of the static busybox and links to
// the applets the tests use.
func busyboxTar() ([]byte, error) {
	bb, err := lookPath("busybox")
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return nil, err
	}
	if f, err := elf.NewFile(bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("%s: %w", bb, err)
	} else if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		return nil, fmt.Errorf("%s is not static (install busybox-static)", bb)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error { h.ModTime = time.Unix(0, 0); return tw.WriteHeader(h) }
	for _, d := range []string{"bin/", "tmp/", "proc/", "sys/", "dev/", "etc/"} {
		if err := hdr(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	if err := hdr(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	for _, a := range []string{"sh", "sleep", "nc", "ip", "cat", "ping"} {
		if err := hdr(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// AddContainer starts a container on the node, on the overlay network,
// and returns it once the sender's host knows it on the overlay.
func (s *Swarm) AddContainer(ctx context.Context) (Container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Container{}, errors.New("add container: swarm closed")
	}
	return s.addContainer(ctx)
}

func (s *Swarm) addContainer(ctx context.Context) (Container, error) {
	s.seq++
	c, err := s.run(ctx, s.Node, s.name("c"+strconv.Itoa(s.seq)))
	if err != nil {
		return Container{}, err
	}
	if s.Sandbox == "" {
		if s.Sandbox, err = s.sandboxOf(ctx, s.Node); err != nil {
			return Container{}, err
		}
		if err := s.readVNI(); err != nil {
			return Container{}, err
		}
	}
	if c.HostDev, err = hostDev(c, s.Sandbox); err != nil {
		return Container{}, err
	}
	if err := s.waitKnown(ctx, c); err != nil {
		return Container{}, err
	}
	s.Containers = append(s.Containers, c)
	s.logf("container %s (%s) at %s", c.Name, c.ID[:12], c.Addr)
	return c, nil
}

// run starts a container (restarted with its engine) that sleeps, and
// reads its namespace, address and MAC on the overlay.
func (s *Swarm) run(ctx context.Context, e *Engine, name string) (Container, error) {
	if _, err := e.Docker(ctx, nil, "run", "-d", "--init", "--restart", "always", "--stop-timeout", "1",
		"--name", name, "--network", s.Network, SwarmImage, "sleep", "86400"); err != nil {
		return Container{}, err
	}
	return s.inspect(ctx, e, name)
}

func (s *Swarm) inspect(ctx context.Context, e *Engine, name string) (Container, error) {
	out, err := e.Docker(ctx, nil, "inspect", name)
	if err != nil {
		return Container{}, err
	}
	var v []struct {
		ID              string `json:"Id"`
		State           struct{ Running bool }
		NetworkSettings struct {
			SandboxKey string
			Networks   map[string]struct {
				IPAddress  string
				MacAddress string
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v) != 1 {
		return Container{}, fmt.Errorf("inspect %s: %v", name, err)
	}
	nw, ok := v[0].NetworkSettings.Networks[s.Network]
	if !v[0].State.Running || !ok || v[0].NetworkSettings.SandboxKey == "" {
		return Container{}, fmt.Errorf("container %s is not running on %s", name, s.Network)
	}
	c := Container{Name: name, ID: v[0].ID, Netns: v[0].NetworkSettings.SandboxKey}
	if c.Addr, err = netip.ParseAddr(nw.IPAddress); err != nil {
		return Container{}, fmt.Errorf("container %s: address %q: %w", name, nw.IPAddress, err)
	}
	if c.MAC, err = net.ParseMAC(nw.MacAddress); err != nil {
		return Container{}, fmt.Errorf("container %s: MAC %q: %w", name, nw.MacAddress, err)
	}
	err = netns.Do(c.Netns, false, func() error {
		links, err := nldump.Retry(netlink.LinkList)
		if err != nil {
			return err
		}
		for _, l := range links {
			if bytes.Equal(l.Attrs().HardwareAddr, c.MAC) {
				c.Dev = l.Attrs().Name
				return nil
			}
		}
		return fmt.Errorf("no interface with %s", c.MAC)
	})
	if err != nil {
		return Container{}, fmt.Errorf("container %s: %w", name, err)
	}
	return c, nil
}

// hostDev is the name of the sandbox's end of the container's veth.
func hostDev(c Container, sandbox string) (string, error) {
	var peer int
	if err := netns.Do(c.Netns, false, func() error {
		l, err := netlink.LinkByName(c.Dev)
		if err == nil {
			peer = l.Attrs().ParentIndex
		}
		return err
	}); err != nil {
		return "", err
	}
	var name string
	err := netns.Do(sandbox, false, func() error {
		l, err := netlink.LinkByIndex(peer)
		if err == nil {
			name = l.Attrs().Name
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("container %s's veth in the sandbox: %w", c.Name, err)
	}
	return name, nil
}

// sandboxOf waits for the engine's sandbox of the overlay network: the
// namespace file <exec root>/netns/<epoch>-<network id, 10 digits>
// holding vxlan0.
func (s *Swarm) sandboxOf(ctx context.Context, e *Engine) (string, error) {
	var last error
	deadline := time.Now().Add(30 * time.Second)
	for {
		ms, _ := filepath.Glob(filepath.Join(e.NetnsDir(), "*-"+s.NetworkID[:10]))
		slices.Sort(ms)
		for i := len(ms) - 1; i >= 0; i-- {
			p := ms[i]
			last = netns.Do(p, false, func() error { _, err := netlink.LinkByName("vxlan0"); return err })
			if last == nil {
				return p, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("no sandbox of network %s in %s (%v): %v", s.NetworkID, e.NetnsDir(), ms, last)
		}
		time.Sleep(50 * time.Millisecond) // polls for dockerd's sandbox with a deadline
	}
}

func (s *Swarm) readVNI() error {
	return netns.Do(s.Sandbox, false, func() error {
		l, err := netlink.LinkByName("vxlan0")
		if err != nil {
			return err
		}
		vx, ok := l.(*netlink.Vxlan)
		if !ok {
			return errors.New("vxlan0 is not a VXLAN device")
		}
		s.VNI, s.Port = vx.VxlanId, vx.Port
		return nil
	})
}

// waitKnown waits until the remote's sandbox has c's neighbour entry on
// vxlan0 (the overlay driver installs it from the swarm's gossip), so
// the sender's packets to c go out over the wire at once.
func (s *Swarm) waitKnown(ctx context.Context, c Container) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var found bool
		err := netns.Do(s.RemoteSandbox, false, func() error {
			ns, err := nldump.Retry(func() ([]netlink.Neigh, error) { return netlink.NeighList(0, netlink.FAMILY_V4) })
			if err != nil {
				return err
			}
			for _, n := range ns {
				if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == c.Addr && bytes.Equal(n.HardwareAddr, c.MAC) {
					found = true
				}
			}
			return nil
		})
		if found {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the remote host does not know container %s (%s) after 30s: %v", c.Name, c.Addr, err)
		}
		time.Sleep(50 * time.Millisecond) // polls the remote sandbox's neighbours with a deadline
	}
}

// RemoveContainer removes the node's container named name.
func (s *Swarm) RemoveContainer(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.Containers, func(c Container) bool { return c.Name == name })
	if i < 0 {
		return fmt.Errorf("remove container %s: no such container", name)
	}
	if _, err := s.Node.Docker(ctx, nil, "rm", "-f", name); err != nil {
		return err
	}
	s.Containers = slices.Delete(s.Containers, i, i+1)
	return nil
}

// RestartNode restarts the receiving node's dockerd (SIGTERM, wait,
// start with the same arguments) and waits until its containers run
// again on the overlay (their restart policy is "always"). A swarm
// engine cannot keep its containers across a restart (--live-restore is
// refused in swarm mode): the containers, their namespaces and the
// overlay's sandbox are made anew; the sandbox keeps its file name
// (1-<id>: the epoch counts from 1 in each daemon run). Containers and
// Sandbox are updated; it returns when the node is quiet again (settle).
func (s *Swarm) RestartNode(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.Node.stop(); err != nil {
		return err
	}
	if err := s.Node.start(ctx, s.docker); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for {
		st, err := s.Node.Docker(ctx, nil, "info", "--format", "{{.Swarm.LocalNodeState}}")
		if err == nil && strings.TrimSpace(st) == "active" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node not back in the swarm after 60s: %q %v", st, err)
		}
		time.Sleep(100 * time.Millisecond) // polls the daemon with a deadline
	}
	for i, c := range s.Containers {
		for {
			nc, err := s.inspect(ctx, s.Node, c.Name)
			if err == nil && nc.Netns != "" {
				s.Sandbox = ""
				if s.Sandbox, err = s.sandboxOf(ctx, s.Node); err == nil {
					if nc.HostDev, err = hostDev(nc, s.Sandbox); err == nil {
						if err = s.waitKnown(ctx, nc); err == nil {
							s.Containers[i] = nc
							break
						}
					}
				}
			}
			last = err
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("container %s not back after the restart: %v", c.Name, last)
			}
			time.Sleep(100 * time.Millisecond) // polls the restarted container with a deadline
		}
	}
	if err := s.readVNI(); err != nil {
		return err
	}
	return s.settle(ctx)
}

// settle waits until the node is quiet: dockerd goes on after its
// containers run (the gateway bridge's endpoints, iptables chains such as
// DOCKER-USER, the sandbox's load balancer endpoint). Quiet is the same
// fingerprint of the node's namespaces (devices, their flags and masters,
// addresses, iptables-save) for a second, polled every 100 ms, within 60 s.
func (s *Swarm) settle(ctx context.Context) error {
	const quiet = 10
	deadline := time.Now().Add(60 * time.Second)
	var last string
	same := 0
	for {
		fp, err := s.fingerprint()
		if err == nil && fp == last {
			same++
			if same >= quiet {
				return nil
			}
		} else {
			same, last = 0, fp
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the node did not settle in 60s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond) // polls the node's state with a deadline
	}
}

// fingerprint is a summary of the node's host namespace and sandbox.
func (s *Swarm) fingerprint() (string, error) {
	var b strings.Builder
	for _, ns := range []string{s.Node.Netns, s.Sandbox} {
		err := netns.Do(ns, false, func() error {
			links, err := nldump.Retry(netlink.LinkList)
			if err != nil {
				return err
			}
			for _, l := range links {
				a := l.Attrs()
				fmt.Fprintf(&b, "%s %v %d %d\n", a.Name, a.Flags, a.MasterIndex, a.MTU)
			}
			addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
			if err != nil {
				return err
			}
			for _, a := range addrs {
				fmt.Fprintf(&b, "%s %d\n", a.IPNet, a.LinkIndex)
			}
			out, err := exec.Command("iptables-save").Output()
			if err != nil {
				return fmt.Errorf("iptables-save: %w", err)
			}
			for _, l := range strings.Split(string(out), "\n") {
				if !strings.HasPrefix(l, "#") {
					b.WriteString(l + "\n")
				}
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

// Close removes everything Up made, in the reverse order, and may be
// called again (also after a failed Up): the containers, the swarm (the
// node leaves, the manager leaves), the daemons (SIGTERM, SIGKILL after
// a bounded wait), any containerd, shim or container process left in
// the engines' directories or cgroups, the containers' cgroups, every
// mount under the engines' directories, the directories, the hosts'
// namespaces (with them every device, address, route and iptables rule
// the daemons added), and /run/containerd if Up created it (the shims'
// sockets live there whatever containerd's state directory).
func (s *Swarm) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	engines := []*Engine{s.Node, s.Remote}
	for _, e := range engines {
		if e == nil || e.PID() == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if ids, err := e.Docker(ctx, nil, "ps", "-aq"); err == nil && strings.TrimSpace(ids) != "" {
			if _, err := e.Docker(ctx, nil, append([]string{"rm", "-f"}, strings.Fields(ids)...)...); err != nil {
				errs = append(errs, err)
			}
		}
		if st, err := e.Docker(ctx, nil, "info", "--format", "{{.Swarm.LocalNodeState}}"); err == nil && strings.TrimSpace(st) != "inactive" {
			if _, err := e.Docker(ctx, nil, "swarm", "leave", "--force"); err != nil {
				errs = append(errs, err)
			}
		}
		cancel()
	}
	// containerd dumps its goroutine stacks to the temporary directory,
	// named by its PID, when dockerd signals it on the way down: known
	// before the stop, removed once it is gone (seen once in CI).
	var stackLogs []string
	for _, pid := range s.DaemonPIDs() {
		stackLogs = append(stackLogs, filepath.Join(os.TempDir(), fmt.Sprintf("containerd.%d.stacks.log", pid)))
	}
	for _, e := range engines {
		if e == nil {
			continue
		}
		if err := e.stop(); err != nil {
			errs = append(errs, err)
		}
		if err := e.reapLeftovers(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range stackLogs {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if s.dir != "" {
		if err := unmountUnder(s.dir); err != nil {
			errs = append(errs, err)
		} else if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(s.created) - 1; i >= 0; i-- {
		if err := nodes.DeleteNetns(s.created[i]); err != nil {
			errs = append(errs, err)
			continue
		}
		s.created = slices.Delete(s.created, i, i+1)
	}
	for i := len(s.madeRunCD) - 1; i >= 0; i-- {
		// Only if empty: another containerd may have come since.
		if err := os.Remove(s.madeRunCD[i]); errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			// Another containerd's shims use it now: theirs to keep.
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", s.madeRunCD[i], err))
			continue
		}
		s.madeRunCD = slices.Delete(s.madeRunCD, i, i+1)
	}
	return errors.Join(errs...)
}

// reapLeftovers kills, by PID, the processes the engine left: its
// containerd and shims (their command lines name the engine's
// directory) and container processes (in its cgroup parent), waits for
// them to go (bounded), and removes its cgroups.
func (e *Engine) reapLeftovers() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := e.leftoverPIDs()
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("engine %s: processes %v survive SIGKILL", e.Name, pids)
		}
		for _, p := range pids {
			unix.Kill(p, unix.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond) // polls for the killed processes to exit, with a deadline
	}
	return e.removeCgroups()
}

// leftoverPIDs are the processes of this engine still alive: command
// line naming its directory, or member of one of its cgroups.
func (e *Engine) leftoverPIDs() []int {
	seen := map[int]bool{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(e.dir+"/")) {
			seen[pid] = true
		}
	}
	for _, d := range e.cgroupDirs() {
		filepath.WalkDir(d, func(path string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || de.Name() != "cgroup.procs" {
				return nil
			}
			f, err := os.Open(path)
			if err != nil {
				return nil
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if pid, err := strconv.Atoi(sc.Text()); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	out := make([]int, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// cgroupDirs are the engine's cgroup parent in every mounted hierarchy
// (v1: one per controller; v2: one).
func (e *Engine) cgroupDirs() []string {
	if e.CgroupParent == "" {
		return nil
	}
	var out []string
	for _, root := range cgroupRoots() {
		d := filepath.Join(root, e.CgroupParent)
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// cgroupRoots are the mount points of the cgroup hierarchies.
func cgroupRoots() []string {
	var out []string
	for _, m := range mounts() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out
}

// removeCgroups removes the engine's cgroups, the deepest first.
func (e *Engine) removeCgroups() error {
	var errs []error
	for _, d := range e.cgroupDirs() {
		var dirs []string
		filepath.WalkDir(d, func(path string, de os.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

type mount struct{ point, fstype string }

// mounts are the calling thread's mount namespace's mounts, from
// mountinfo: the thread's own, not the process leader's (/proc/self),
// which may be a thread left in a private mount namespace (netns.Do with
// sysfs).
func mounts() []mount {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mount
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		i := slices.Index(f, "-")
		if len(f) < 5 || i < 0 || i+1 >= len(f) {
			continue
		}
		out = append(out, mount{point: unescapeMount(f[4]), fstype: f[i+1]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts (lazily) every mount at or under dir, the
// deepest first: the namespace files, the data root's bind mount, a
// container's shm.
func unmountUnder(dir string) error {
	var errs []error
	for range 5 { // a mount stacked on another shows up again
		var ps []string
		for _, m := range mounts() {
			if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
				ps = append(ps, m.point)
			}
		}
		if len(ps) == 0 {
			return nil
		}
		slices.SortFunc(ps, func(a, b string) int { return len(b) - len(a) })
		errs = errs[:0]
		for _, p := range ps {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			}
		}
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("mounts under %s remain", dir))
	}
	return errors.Join(errs...)
}
