package realnode

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nldump"
	"github.com/rxlane/rxlane/internal/nodes"
)

// FlannelVersion is the flanneld release scripts/setup-flannel builds
// (tools/flannel/go.mod pins it).
const FlannelVersion = "v0.28.10"

// Where scripts/setup-flannel puts what it builds: flanneld in
// FlannelBinDir, the flannel CNI plugin in FlannelCNIDir (beside
// Debian's containernetworking-plugins in /usr/lib/cni).
const (
	FlannelBinDir = "/var/cache/rxlane/bin"
	FlannelCNIDir = "/var/cache/rxlane/cni"
)

// The Flannel node's plan: flanneld's network (each host leases a /24 of
// it), the wire's underlay addresses (etcd listens on the remote's), and
// the datastore's key prefix (flanneld's default).
var (
	FlannelNetwork    = netip.MustParsePrefix("10.244.0.0/16")
	flUnderNode       = netip.MustParsePrefix("198.18.19.2/24")
	flUnderRemote     = netip.MustParsePrefix("198.18.19.1/24")
	FlannelEtcdPrefix = "/coreos.com/network"
)

const (
	flWireDev  = "ens9"
	flVXLANDev = "flannel.1"
	flBridge   = "cni0"
	flEtcdPort = 2379
	// flCNIConfList is the CNI chain kube-flannel installs
	// (10-flannel.conflist): flannel delegating to bridge + host-local,
	// then portmap. The state paths are the handle's own.
	flCNIConfList = `{"cniVersion":"0.3.1","name":"cbr0","plugins":[
	{"type":"flannel","subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%q},
	 "delegate":{"hairpinMode":true,"isDefaultGateway":true}},
	{"type":"portmap","capabilities":{"portMappings":true}}]}`
)

// MissingError says which binary a real node needs is not installed (run
// scripts/setup, as root).
type MissingError struct{ What []string }

func (e *MissingError) Error() string {
	return "not installed (run scripts/setup): " + strings.Join(e.What, ", ")
}

// FlannelBinaries are the programs a Flannel node runs.
type FlannelBinaries struct {
	Flanneld string
	Etcd     string
	// CNIPath are the directories libcni looks for plugins in (flannel,
	// bridge, host-local, portmap).
	CNIPath []string
}

// FindFlannelBinaries looks for flanneld (RXLANE_FLANNELD, FlannelBinDir,
// $GOPATH/bin, $PATH), etcd ($PATH, /usr/bin) and the CNI plugins
// (FlannelCNIDir, /usr/lib/cni, /opt/cni/bin). With RXLANE_CACHE set (as
// for scripts/setup-flannel), its bin and cni replace FlannelBinDir and
// FlannelCNIDir. A *MissingError names what is not there.
func FindFlannelBinaries() (FlannelBinaries, error) {
	var b FlannelBinaries
	binDir, cniDir := FlannelBinDir, FlannelCNIDir
	if c := os.Getenv("RXLANE_CACHE"); c != "" {
		binDir, cniDir = filepath.Join(c, "bin"), filepath.Join(c, "cni")
	}
	var missing []string
	look := func(name string, dirs ...string) string {
		for _, d := range dirs {
			if d == "" {
				continue
			}
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		missing = append(missing, name)
		return ""
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if h, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(h, "go")
		}
	}
	if p := os.Getenv("RXLANE_FLANNELD"); p != "" {
		b.Flanneld = p
	} else {
		b.Flanneld = look("flanneld", binDir, filepath.Join(gopath, "bin"))
	}
	b.Etcd = look("etcd", "/usr/bin")
	b.CNIPath = []string{cniDir, "/usr/lib/cni", "/opt/cni/bin"}
	for _, plugin := range []string{"flannel", "bridge", "host-local", "portmap"} {
		found := false
		for _, d := range b.CNIPath {
			if _, err := os.Stat(filepath.Join(d, plugin)); err == nil {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, "CNI plugin "+plugin)
		}
	}
	if len(missing) > 0 {
		return b, &MissingError{What: missing}
	}
	return b, nil
}

// FlannelOptions say what to bring up.
type FlannelOptions struct {
	// Pods is how many pods the node gets at Up: 0 means 1, negative
	// none.
	Pods int
	// Prefix starts the hosts' namespace names (PREFIX<id>-node,
	// PREFIX<id>-remote in /run/netns); default "rxfl".
	Prefix string
	// Timeout bounds each wait of Up (etcd answering, flanneld's lease,
	// a pod's CNI ADD); default 30s.
	Timeout time.Duration
}

// Flannel is a real Flannel node: two hosts (namespaces joined by a veth
// wire), each running flanneld with the VXLAN backend against one etcd
// (in the remote host's namespace), and pods on the receiving host plugged
// by the flannel CNI plugin through libcni.
type Flannel struct {
	// Netns is the receiving host's namespace file (flanneld, flannel.1,
	// cni0, the pods' veths); Remote the sending host's (its flanneld
	// and etcd).
	Netns, Remote string
	Wire          nodes.Wire
	// Subnet and RemoteSubnet are the hosts' leases (FLANNEL_SUBNET's
	// network); RemoteInner is the address on the remote's flannel.1: a
	// sender bound to it in Remote reaches the pods encapsulated.
	Subnet, RemoteSubnet netip.Prefix
	RemoteInner          netip.Addr
	// VTEP and RemoteVTEP are the flannel.1 devices' MACs, VNI and Port
	// theirs (flanneld's defaults: 1 and 8472).
	VTEP, RemoteVTEP net.HardwareAddr
	VNI, Port        int
	// SubnetFile and RemoteSubnetFile are flanneld's -subnet-file of each
	// host; EtcdEndpoint is the datastore's client URL (reachable from
	// both hosts).
	SubnetFile, RemoteSubnetFile string
	EtcdEndpoint                 string
	// Dir holds everything the node writes outside its namespaces:
	// etcd's data, the subnet files, the CNI plugins' state and the
	// daemons' logs. Close removes it.
	Dir string
	// Pods are the node's pods; read them while no AddPod or DelPod
	// runs.
	Pods []nodes.Pod

	bins     FlannelBinaries
	opts     FlannelOptions
	mu       sync.Mutex
	procs    map[string]*flProc // etcd, flanneld-node, flanneld-remote
	created  []string           // namespace files, in creation order
	cni      *libcni.CNIConfig
	confList *libcni.NetworkConfigList
	closed   bool
}

// UpFlannel brings a Flannel node up. On an error everything started so
// far is stopped and removed. A *MissingError (errors.As) says a binary
// is not installed.
func UpFlannel(o FlannelOptions) (*Flannel, error) {
	bins, err := FindFlannelBinaries()
	if err != nil {
		return nil, err
	}
	if o.Prefix == "" {
		o.Prefix = "rxfl"
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	f := &Flannel{bins: bins, opts: o, procs: map[string]*flProc{}}
	if err := f.up(); err != nil {
		return nil, errors.Join(fmt.Errorf("bring up flannel node: %w", err), f.Close())
	}
	return f, nil
}

// flTestHook, when set by a test, runs at each step of Up and fails it
// with its error.
var flTestHook func(step string, f *Flannel) error

func (f *Flannel) step(name string) error {
	if flTestHook != nil {
		return flTestHook(name, f)
	}
	return nil
}

func (f *Flannel) up() error {
	var err error
	if f.Dir, err = os.MkdirTemp("", "rxlane-flannel-"); err != nil {
		return err
	}
	id := flRandHex(4)
	if f.Netns, err = f.newNetns(f.opts.Prefix + id + "-node"); err != nil {
		return err
	}
	if f.Remote, err = f.newNetns(f.opts.Prefix + id + "-remote"); err != nil {
		return err
	}
	if err := f.buildWire(); err != nil {
		return fmt.Errorf("wire: %w", err)
	}
	if err := f.step("wire"); err != nil {
		return err
	}
	if err := f.startEtcd(); err != nil {
		return err
	}
	if err := f.step("etcd"); err != nil {
		return err
	}
	f.SubnetFile = filepath.Join(f.Dir, "node-subnet.env")
	f.RemoteSubnetFile = filepath.Join(f.Dir, "remote-subnet.env")
	// One host at a time: two flanneld that pick the same free subnet in
	// the same instant lose the race in etcd's transaction, and flannel
	// (v0.28) exits on that ("failed to acquire lease: subnet already
	// exists") instead of picking again; about 1 bring-up in 100 did. In
	// a cluster nodes join one by one and kubelet restarts the loser.
	if err := f.startFlanneld("node"); err != nil {
		return err
	}
	if err := f.waitLease("node"); err != nil {
		return err
	}
	if err := f.startFlanneld("remote"); err != nil {
		return err
	}
	if err := f.step("flanneld"); err != nil {
		return err
	}
	for _, h := range []string{"node", "remote"} {
		if err := f.waitFlanneld(h, time.Time{}); err != nil {
			return err
		}
	}
	if err := f.readVTEPs(); err != nil {
		return err
	}
	f.cni = libcni.NewCNIConfigWithCacheDir(f.bins.CNIPath, filepath.Join(f.Dir, "cni-cache"), nil)
	conf := fmt.Sprintf(flCNIConfList, f.SubnetFile, filepath.Join(f.Dir, "cni-flannel"), filepath.Join(f.Dir, "cni-ipam"))
	if f.confList, err = libcni.NetworkConfFromBytes([]byte(conf)); err != nil {
		return fmt.Errorf("parse cni conflist: %w", err)
	}
	n := f.opts.Pods
	if n == 0 {
		n = 1
	}
	for range max(n, 0) {
		if _, err := f.addPod(); err != nil {
			return err
		}
	}
	return f.step("pods")
}

// newNetns creates a namespace in /run/netns and records it for Close.
// It is made on a thread that returns to its own namespace
// (netns.NewNamed), not one that ends inside it: a thread that cannot end
// (Go's main thread, when the goroutine happens to run there) would stay
// parked in the namespace and keep it, its devices and its iptables
// rules alive after Close.
func (f *Flannel) newNetns(name string) (string, error) {
	if err := netns.NewNamed(name); err != nil {
		return "", err
	}
	p := filepath.Join(nodes.RunNetnsDir, name)
	f.created = append(f.created, p)
	return p, nil
}

// buildWire joins the hosts: ens9 in each, the underlay addresses, lo up.
func (f *Flannel) buildWire() error {
	f.Wire = nodes.Wire{NodeDev: flWireDev, RemoteDev: flWireDev,
		NodeAddrs: []netip.Prefix{flUnderNode}, RemoteAddrs: []netip.Prefix{flUnderRemote}}
	err := netns.Do(f.Netns, false, func() error {
		h, err := vnetns.GetFromPath(f.Remote)
		if err != nil {
			return err
		}
		defer h.Close()
		// txqueuelen 1000 as a NIC (and `ip link add`) has: the
		// netlink library's zero value would make it 0, which the
		// kernel turns into 1000 when a qdisc (the lane's clsact) is
		// added, and never back.
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: flWireDev, TxQLen: 1000}, PeerName: flWireDev,
			PeerTxQLen: 1000, PeerNamespace: netlink.NsFd(h)})
	})
	if err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	for _, s := range []struct {
		ns   string
		addr netip.Prefix
		mac  *net.HardwareAddr
	}{{f.Netns, flUnderNode, &f.Wire.NodeMAC}, {f.Remote, flUnderRemote, &f.Wire.RemoteMAC}} {
		err := netns.Do(s.ns, false, func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(lo); err != nil {
				return err
			}
			l, err := netlink.LinkByName(flWireDev)
			if err != nil {
				return err
			}
			a := &netlink.Addr{IPNet: &net.IPNet{IP: s.addr.Addr().AsSlice(), Mask: net.CIDRMask(s.addr.Bits(), 32)}}
			if err := netlink.AddrAdd(l, a); err != nil {
				return fmt.Errorf("add %s: %w", s.addr, err)
			}
			*s.mac = l.Attrs().HardwareAddr
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(s.ns), err)
		}
	}
	return nil
}

// startEtcd runs etcd in the remote host's namespace, on its underlay
// address and loopback, with its data in Dir, and writes flanneld's
// network config (VXLAN backend) once it answers.
func (f *Flannel) startEtcd() error {
	remote := flUnderRemote.Addr().String()
	f.EtcdEndpoint = fmt.Sprintf("http://%s:%d", remote, flEtcdPort)
	p, err := flStart(f.Remote, "etcd", filepath.Join(f.Dir, "etcd.log"), []string{f.bins.Etcd,
		"--name", "rxlane", "--data-dir", filepath.Join(f.Dir, "etcd"),
		"--listen-client-urls", fmt.Sprintf("%s,http://127.0.0.1:%d", f.EtcdEndpoint, flEtcdPort),
		"--advertise-client-urls", f.EtcdEndpoint,
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "rxlane=http://127.0.0.1:2380"})
	if err != nil {
		return err
	}
	f.procs["etcd"] = p
	cfg, _ := json.Marshal(map[string]any{"Network": FlannelNetwork.String(), "Backend": map[string]any{"Type": "vxlan"}})
	var last error
	for deadline := time.Now().Add(f.opts.Timeout); time.Now().Before(deadline); {
		if last = f.etcdPut(FlannelEtcdPrefix+"/config", string(cfg)); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("etcd exited: %v%s", p.err, flTail(filepath.Join(f.Dir, "etcd.log")))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("etcd did not answer within %s: %w%s", f.opts.Timeout, last, flTail(filepath.Join(f.Dir, "etcd.log")))
}

// flanneldArgs are a host's flanneld flags, as kube-flannel's DaemonSet
// passes them (--ip-masq), with etcd instead of the Kubernetes API.
func (f *Flannel) flanneldArgs(host string) []string {
	return []string{f.bins.Flanneld, "--etcd-endpoints=" + f.EtcdEndpoint, "--etcd-prefix=" + FlannelEtcdPrefix,
		"--iface=" + flWireDev, "--subnet-file=" + f.subnetFile(host), "--ip-masq"}
}

// subnetFile is where a host's flanneld writes its lease.
func (f *Flannel) subnetFile(host string) string {
	if host == "remote" {
		return f.RemoteSubnetFile
	}
	return f.SubnetFile
}

func (f *Flannel) hostNetns(host string) string {
	if host == "remote" {
		return f.Remote
	}
	return f.Netns
}

func (f *Flannel) startFlanneld(host string) error {
	p, err := flStart(f.hostNetns(host), "flanneld", f.flanneldLog(host), f.flanneldArgs(host))
	if err != nil {
		return err
	}
	f.procs["flanneld-"+host] = p
	return nil
}

// flanneldLog is where a host's flanneld writes (each start appends).
func (f *Flannel) flanneldLog(host string) string {
	return filepath.Join(f.Dir, "flanneld-"+host+".log")
}

// waitLease waits until a host's flanneld has written its subnet file,
// i.e. holds its lease in etcd.
func (f *Flannel) waitLease(host string) error {
	p := f.procs["flanneld-"+host]
	sf := f.subnetFile(host)
	deadline := time.Now().Add(f.opts.Timeout)
	for {
		if _, err := flReadSubnet(sf); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("flanneld on %s wrote no lease to %s within %s%s", host, sf, f.opts.Timeout, flTail(f.flanneldLog(host)))
		}
		select {
		case <-p.done:
			return fmt.Errorf("flanneld on %s exited: %v%s", host, p.err, flTail(f.flanneldLog(host)))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitFlanneld waits until a host's flanneld has written its subnet file
// (after since, when set: a restart) and the host routes the other host's
// lease through flannel.1 (with both leases known).
func (f *Flannel) waitFlanneld(host string, since time.Time) error {
	p := f.procs["flanneld-"+host]
	sf, otherSF := f.SubnetFile, f.RemoteSubnetFile
	own, other := &f.Subnet, &f.RemoteSubnet
	if host == "remote" {
		sf, otherSF, own, other = f.RemoteSubnetFile, f.SubnetFile, &f.RemoteSubnet, &f.Subnet
	}
	deadline := time.Now().Add(f.opts.Timeout)
	var why string
	for {
		why = ""
		if st, err := os.Stat(sf); err != nil || st.ModTime().Before(since) {
			why = "no subnet file " + sf
		} else if sn, err := flReadSubnet(sf); err != nil {
			why = err.Error()
		} else {
			*own = sn
			if sn, err := flReadSubnet(otherSF); err == nil {
				*other = sn
			}
			if !other.IsValid() {
				why = "the other host's lease is not known yet"
			} else if ok, err := f.routes(host, *other); err != nil {
				return err
			} else if !ok {
				why = "no route to " + other.String() + " via " + flVXLANDev
			}
		}
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			// The other host's flanneld decides half of readiness (its
			// lease): its log is the evidence as often as this one's.
			return fmt.Errorf("flanneld on %s not ready within %s: %s%s%s", host, f.opts.Timeout, why,
				flTail(f.flanneldLog(host)), flTail(f.flanneldLog(otherHost(host))))
		}
		// A flanneld that exits is an error at once, whichever host it
		// serves: waiting for the other's lease would only time out.
		for _, h := range []string{host, otherHost(host)} {
			if q := f.procs["flanneld-"+h]; q != nil && q.exited() {
				return fmt.Errorf("flanneld on %s exited: %v%s", h, q.err, flTail(f.flanneldLog(h)))
			}
		}
		select {
		case <-p.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func otherHost(host string) string {
	if host == "remote" {
		return "node"
	}
	return "remote"
}

// routes reports whether host routes dst through flannel.1.
func (f *Flannel) routes(host string, dst netip.Prefix) (bool, error) {
	ok := false
	err := netns.Do(f.hostNetns(host), false, func() error {
		l, err := netlink.LinkByName(flVXLANDev)
		if err != nil {
			return nil // not made yet
		}
		rs, err := nldump.Retry(func() ([]netlink.Route, error) { return netlink.RouteList(l, netlink.FAMILY_V4) })
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Dst != nil && r.Dst.String() == dst.String() {
				ok = true
			}
		}
		return nil
	})
	return ok, err
}

// readVTEPs reads flannel.1 on both hosts: MACs, VNI, port, the remote's
// inner address.
func (f *Flannel) readVTEPs() error {
	for _, h := range []string{"node", "remote"} {
		err := netns.Do(f.hostNetns(h), false, func() error {
			l, err := netlink.LinkByName(flVXLANDev)
			if err != nil {
				return err
			}
			vx, ok := l.(*netlink.Vxlan)
			if !ok {
				return fmt.Errorf("%s is a %s, not vxlan", flVXLANDev, l.Type())
			}
			if h == "node" {
				f.VTEP, f.VNI, f.Port = vx.HardwareAddr, vx.VxlanId, vx.Port
				return nil
			}
			f.RemoteVTEP = vx.HardwareAddr
			as, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_V4) })
			if err != nil || len(as) == 0 {
				return fmt.Errorf("no address on the remote's %s: %v", flVXLANDev, err)
			}
			f.RemoteInner, _ = netip.AddrFromSlice(as[0].IP.To4())
			return nil
		})
		if err != nil {
			return fmt.Errorf("read %s on %s: %w", flVXLANDev, h, err)
		}
	}
	return nil
}

// flReadSubnet reads FLANNEL_SUBNET from a subnet file, as the lease's
// network (10.244.N.0/24).
func flReadSubnet(path string) (netip.Prefix, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "FLANNEL_SUBNET="); ok {
			p, err := netip.ParsePrefix(strings.TrimSpace(v))
			if err != nil {
				return netip.Prefix{}, fmt.Errorf("subnet file %s: %w", path, err)
			}
			return p.Masked(), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("subnet file %s has no FLANNEL_SUBNET", path)
}

// AddPod adds a pod as a container runtime does: a fresh namespace
// (cni-<uuid> in /run/netns), then CNI ADD of the flannel conflist
// through libcni, run in the node's namespace. It returns the pod as the
// CNI result and the pod's namespace show it.
func (f *Flannel) AddPod() (nodes.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nodes.Pod{}, errors.New("add pod: flannel node closed")
	}
	return f.addPod()
}

func (f *Flannel) addPod() (nodes.Pod, error) {
	u := flRandHex(16)
	name := "cni-" + u[:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:]
	path, err := f.newNetns(name)
	if err != nil {
		return nodes.Pod{}, fmt.Errorf("add pod: %w", err)
	}
	p := nodes.Pod{Name: name, Netns: path, Dev: "eth0", HostNetns: f.Netns}
	ctx, cancel := context.WithTimeout(context.Background(), f.opts.Timeout)
	defer cancel()
	rt := &libcni.RuntimeConf{ContainerID: name, NetNS: path, IfName: p.Dev}
	var res *types100.Result
	err = netns.Do(f.Netns, false, func() error {
		r, err := f.cni.AddNetworkList(ctx, f.confList, rt)
		if err != nil {
			return err
		}
		res, err = types100.NewResultFromResult(r)
		return err
	})
	if err != nil {
		return nodes.Pod{}, fmt.Errorf("add pod %s: cni add: %w", name, err)
	}
	for _, i := range res.Interfaces {
		switch {
		case i.Sandbox == path && i.Name == p.Dev:
			p.MAC, _ = net.ParseMAC(i.Mac)
		case i.Sandbox == "" && i.Name != flBridge:
			p.HostDev = i.Name
		}
	}
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			p.Addrs = append(p.Addrs, a.Unmap())
		}
	}
	if p.HostDev == "" || len(p.MAC) == 0 || len(p.Addrs) == 0 {
		return nodes.Pod{}, fmt.Errorf("add pod %s: cni result lacks the veth, MAC or address: %+v", name, res)
	}
	f.Pods = append(f.Pods, p)
	return p, nil
}

// DelPod removes a pod (by namespace name or file) as the runtime does:
// CNI DEL through libcni, then its namespace.
func (f *Flannel) DelPod(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.Pods, func(p nodes.Pod) bool { return p.Name == name || p.Netns == name })
	if i < 0 {
		return fmt.Errorf("delete pod %s: no such pod", name)
	}
	p := f.Pods[i]
	ctx, cancel := context.WithTimeout(context.Background(), f.opts.Timeout)
	defer cancel()
	rt := &libcni.RuntimeConf{ContainerID: p.Name, NetNS: p.Netns, IfName: p.Dev}
	if err := netns.Do(f.Netns, false, func() error { return f.cni.DelNetworkList(ctx, f.confList, rt) }); err != nil {
		return fmt.Errorf("delete pod %s: cni del: %w", name, err)
	}
	if err := nodes.DeleteNetns(p.Netns); err != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	f.created = slices.DeleteFunc(f.created, func(c string) bool { return c == p.Netns })
	f.Pods = slices.Delete(f.Pods, i, i+1)
	return nil
}

// RestartFlanneld stops the receiving host's flanneld (SIGTERM, as a
// DaemonSet rollout does) and starts it again with the same flags, and
// returns when the new one has rewritten its subnet file and routes the
// remote's lease. flanneld leaves flannel.1, its routes and rules in
// place when it stops and takes its lease back from the subnet file.
func (f *Flannel) RestartFlanneld() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("restart flanneld: flannel node closed")
	}
	if err := f.procs["flanneld-node"].stop(5 * time.Second); err != nil {
		return fmt.Errorf("restart flanneld: %w", err)
	}
	since := time.Now()
	if err := f.startFlanneld("node"); err != nil {
		return fmt.Errorf("restart flanneld: %w", err)
	}
	if err := f.waitFlanneld("node", since); err != nil {
		return fmt.Errorf("restart flanneld: %w", err)
	}
	return nil
}

// FlanneldPID is the process ID of a host's ("node" or "remote")
// flanneld, 0 when it is not running.
func (f *Flannel) FlanneldPID(host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.procs["flanneld-"+host]; p != nil && !p.exited() {
		return p.cmd.Process.Pid
	}
	return 0
}

// DaemonPIDs are the node's daemons' process IDs (etcd, both flanneld)
// that are running: what runs beside a measurement on a real node and a
// hand-built one has not (bench compare --freeze-daemons stops them).
func (f *Flannel) DaemonPIDs() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for _, name := range []string{"etcd", "flanneld-node", "flanneld-remote"} {
		if p := f.procs[name]; p != nil && !p.exited() {
			out = append(out, p.cmd.Process.Pid)
		}
	}
	return out
}

// Node describes the Flannel node in package nodes' terms (one tunnel,
// flannel.1; the bridge cni0; the pods), for code written for nodes'
// Flannel shape (bench compare's node runner, tests). It is a
// description: its own Close and AddPod must not be used; use the
// Flannel's.
func (f *Flannel) Node() *nodes.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &nodes.Node{Kind: nodes.Flannel, Netns: f.Netns, Remote: f.Remote, Wire: f.Wire, Bridge: flBridge,
		Tunnels: []nodes.Tunnel{{Dev: flVXLANDev, Netns: f.Netns, VNI: f.VNI, Port: f.Port, Family: 4, MAC: f.VTEP,
			RemoteDev: flVXLANDev, RemoteMAC: f.RemoteVTEP, RemoteInner: []netip.Addr{f.RemoteInner}}},
		Pods: slices.Clone(f.Pods)}
}

// EtcdKeys reads every key under flanneld's prefix (the network config
// and each host's lease) with its value.
func (f *Flannel) EtcdKeys() (map[string]string, error) {
	end := []byte(FlannelEtcdPrefix)
	end[len(end)-1]++
	var resp struct {
		Kvs []struct{ Key, Value []byte } `json:"kvs"`
	}
	if err := f.etcdCall("/v3/kv/range", map[string]any{"key": []byte(FlannelEtcdPrefix), "range_end": end}, &resp); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out, nil
}

func (f *Flannel) etcdPut(key, value string) error {
	return f.etcdCall("/v3/kv/put", map[string]any{"key": []byte(key), "value": []byte(value)}, nil)
}

// etcdCall posts a request to etcd's JSON gateway (byte fields are
// base64, as encoding/json writes []byte) from inside the remote's
// namespace.
func (f *Flannel) etcdCall(path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(f.Remote, false, func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	r, err := cl.Post(fmt.Sprintf("http://127.0.0.1:%d%s", flEtcdPort, path), "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, r.Status, bytes.TrimSpace(b))
	}
	if resp != nil {
		return json.Unmarshal(b, resp)
	}
	return nil
}

// Close stops the daemons (flanneld on both hosts, then etcd: SIGTERM,
// SIGKILL after 5s), deletes every namespace Up and AddPod made (with
// them go flannel.1, cni0, the veths, routes, neighbours and the
// iptables rules flanneld added there), and removes Dir (etcd's data, the
// subnet files, the CNI plugins' state). Safe after a half-failed Up and
// to call again.
func (f *Flannel) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	var errs []error
	for _, name := range []string{"flanneld-node", "flanneld-remote", "etcd"} {
		if p := f.procs[name]; p != nil {
			if err := p.stop(5 * time.Second); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(f.procs, name)
		}
	}
	for i := len(f.created) - 1; i >= 0; i-- {
		if err := nodes.DeleteNetns(f.created[i]); err != nil {
			errs = append(errs, err)
			continue
		}
		f.created = slices.Delete(f.created, i, i+1)
	}
	if f.Dir != "" && len(f.procs) == 0 {
		if err := os.RemoveAll(f.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Namespaces are the namespace files the node holds now (hosts, then
// pods).
func (f *Flannel) Namespaces() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.created)
}

// flProc is a daemon the node started.
type flProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// flSpawner is one OS thread, locked for the life of the process, that
// forks every daemon: a child inherits the network namespace of the
// thread that forks it, and its parent-death signal (Pdeathsig) fires
// when that thread ends. netns.Do's threads may end (a thread left in a
// private mount namespace dies with its goroutine), which would kill a
// daemon forked there; this thread ends only with the process, so a
// crashed test binary takes its daemons along and nothing else does.
var flSpawner struct {
	once sync.Once
	reqs chan flSpawnReq
}

type flSpawnReq struct {
	ns   string
	cmd  *exec.Cmd
	done chan error
}

func flSpawn(ns string, cmd *exec.Cmd) error {
	flSpawner.once.Do(func() {
		flSpawner.reqs = make(chan flSpawnReq)
		ready := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: see flSpawner
			orig, err := vnetns.Get()
			close(ready)
			for r := range flSpawner.reqs {
				if err != nil {
					r.done <- fmt.Errorf("spawner: get own netns: %w", err)
					continue
				}
				r.done <- flSpawnIn(orig, r.ns, r.cmd)
			}
		}()
		<-ready
	})
	r := flSpawnReq{ns: ns, cmd: cmd, done: make(chan error, 1)}
	flSpawner.reqs <- r
	return <-r.done
}

// flSpawnIn starts cmd in the namespace file ns from the spawner's
// thread and returns the thread to orig.
func flSpawnIn(orig vnetns.NsHandle, ns string, cmd *exec.Cmd) error {
	h, err := vnetns.GetFromPath(ns)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", ns, err)
	}
	defer h.Close()
	if err := vnetns.Set(h); err != nil {
		return fmt.Errorf("enter netns %s: %w", ns, err)
	}
	serr := cmd.Start()
	if err := vnetns.Set(orig); err != nil {
		// The thread stays in ns; later starts would inherit it.
		panic(fmt.Sprintf("realnode: spawner cannot return from netns %s: %v", ns, err))
	}
	return serr
}

// flStart starts argv inside the namespace file ns, its output appended
// to logPath, in its own process group, with SIGKILL as its
// parent-death signal (see flSpawner).
func flStart(ns, name, logPath string, argv []string) (*flProc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := flSpawn(ns, cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &flProc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *flProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the process by its PID: SIGTERM, SIGKILL after grace, and
// waits (bounded) for it to be reaped.
func (p *flProc) stop(grace time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	pid := p.cmd.Process.Pid
	if err := p.cmd.Process.Signal(unix.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop %s (pid %d): %w", p.name, pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s (pid %d): %w", p.name, pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, pid)
	}
}

// flTail is the end of a daemon's log, for an error message.
func flTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return "\n--- " + filepath.Base(path) + " (end) ---\n" + string(b)
}

func flRandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
