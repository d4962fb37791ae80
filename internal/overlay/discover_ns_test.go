package overlay

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/netns"

	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// newNamedNS creates a uniquely named namespace, removed in cleanup.
func newNamedNS(t *testing.T) string { return testbedtest.NewNamedNS(t, "rxlanes") }

// TestDiscoverCalicoLike builds a Calico-like routed layout (vxlan.calico
// without a master, a /32 route per pod on a cali* veth, the pod's MAC in
// the neighbour table) and checks discovery finds tunnel, peer, underlay
// and endpoint without knowing any names, and marks the endpoint as needing
// --skip-netfilter: this namespace does not forward (a fresh namespace's
// ip_forward is 0), so the lane would deliver what the normal path drops.
func TestDiscoverCalicoLike(t *testing.T) {
	testbedtest.RequireRoot(t)
	host, pod := newNamedNS(t), newNamedNS(t)
	underMAC := net.HardwareAddr{0x02, 0x10, 0, 0, 0, 1}
	podMAC := net.HardwareAddr{0x0a, 0x58, 0x0a, 0x07, 0x00, 0x02}
	err := netns.Do(host, false, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ens9", HardwareAddr: underMAC}, PeerName: "ens9peer"}); err != nil {
			return err
		}
		u, _ := netlink.LinkByName("ens9")
		netlink.AddrAdd(u, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 9, 2), Mask: net.CIDRMask(24, 32)}})
		netlink.LinkSetUp(u)
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan.calico", MTU: 1450}, VxlanId: 4096, SrcAddr: net.IPv4(198, 18, 9, 2), Port: 4789}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		v, _ := netlink.LinkByName("vxlan.calico")
		netlink.LinkSetUp(v)
		if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: v.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, IP: net.IPv4(198, 18, 9, 1), HardwareAddr: net.HardwareAddr{0x66, 0, 0, 0, 0, 1}}); err != nil {
			return err
		}
		pfd, err := vnetns.GetFromPath(pod)
		if err != nil {
			return err
		}
		defer pfd.Close()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cali1234", MTU: 1450}, PeerName: "eth0",
			PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(pfd)}); err != nil {
			return err
		}
		c, _ := netlink.LinkByName("cali1234")
		netlink.LinkSetUp(c)
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: c.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: net.IPv4(10, 7, 0, 2), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: c.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(10, 7, 0, 2), HardwareAddr: podMAC})
	})
	if err != nil {
		t.Fatal(err)
	}
	topo, err := DiscoverIn(host)
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Tunnels) != 1 {
		t.Fatalf("tunnels: %+v", topo.Tunnels)
	}
	tn := topo.Tunnels[0]
	if !tn.Routed || tn.VNI != 4096 || tn.Port != 4789 || tn.Underlay != "ens9" || len(tn.Peers) != 1 || tn.Peers[0] != netip.MustParseAddr("198.18.9.1") {
		t.Fatalf("tunnel: %+v", tn)
	}
	if len(topo.Endpoints) != 1 {
		t.Fatalf("endpoints: %+v", topo.Endpoints)
	}
	e := topo.Endpoints[0]
	if e.Dev != "cali1234" || e.IP != netip.MustParseAddr("10.7.0.2") || !bytes.Equal(e.MAC, podMAC) || e.VNI != 4096 || e.MTU != 1450 ||
		e.Skip != RoutedSkip+": net.ipv4.conf.vxlan.calico.forwarding=0: the node does not forward (the lane would)" {
		t.Fatalf("endpoint: %+v", e)
	}
}

// TestDiscoverColdRoutedPods builds Calico- and Flannel-shaped nodes as
// their CNIs leave a new pod (a cni-<id> namespace, no neighbour or FDB
// entry for the pod: nothing has been forwarded to it yet) and checks that
// discovery finds each pod's IPv4 and IPv6 address with the MAC of its own
// interface, on the veth that leads to it; and that a pod whose namespace
// has no file falls back to the neighbour table.
func TestDiscoverColdRoutedPods(t *testing.T) {
	testbedtest.RequireRoot(t)
	podMAC := net.HardwareAddr{0x0a, 0x58, 0x0a, 0x07, 0x00, 0x02}
	pod4, pod6 := netip.MustParseAddr("10.7.0.2"), netip.MustParseAddr("fd00:7::2")
	for _, bridged := range []bool{false, true} {
		name := map[bool]string{false: "calico", true: "flannel"}[bridged]
		t.Run(name, func(t *testing.T) {
			host, pod := newNamedNS(t), testbedtest.NewNamedNS(t, "cni")
			hostVeth := "cali0123456789a"
			if bridged {
				hostVeth = "veth0123abcd"
			}
			err := netns.Do(host, false, func() error {
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ens9"}, PeerName: "ens9peer"}); err != nil {
					return err
				}
				u, _ := netlink.LinkByName("ens9")
				netlink.AddrAdd(u, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 9, 2), Mask: net.CIDRMask(24, 32)}})
				netlink.LinkSetUp(u)
				vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan.calico", MTU: 1450}, VxlanId: 4096,
					SrcAddr: net.IPv4(198, 18, 9, 2), Port: 4789, VtepDevIndex: u.Attrs().Index}
				if err := netlink.LinkAdd(vx); err != nil {
					return err
				}
				pfd, err := vnetns.GetFromPath(pod)
				if err != nil {
					return err
				}
				defer pfd.Close()
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostVeth, MTU: 1450}, PeerName: "eth0",
					PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(pfd)}); err != nil {
					return err
				}
				hv, _ := netlink.LinkByName(hostVeth)
				if !bridged {
					netlink.LinkSetUp(hv)
					for _, a := range []netip.Addr{pod4, pod6} {
						if err := netlink.RouteAdd(&netlink.Route{LinkIndex: hv.Attrs().Index, Scope: netlink.SCOPE_LINK,
							Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}); err != nil {
							return err
						}
					}
					return nil
				}
				if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0", MTU: 1450}}); err != nil {
					return err
				}
				br, _ := netlink.LinkByName("cni0")
				netlink.LinkSetMaster(hv, br)
				netlink.LinkSetUp(hv)
				netlink.LinkSetUp(br)
				for _, a := range []string{"10.7.0.1/24", "fd00:7::1/64"} {
					ad, _ := netlink.ParseAddr(a)
					ad.Flags = unix.IFA_F_NODAD
					if err := netlink.AddrAdd(br, ad); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			err = netns.Do(pod, false, func() error {
				e, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				for _, a := range []string{"10.7.0.2/24", "fd00:7::2/64"} {
					if !bridged {
						a = map[string]string{"10.7.0.2/24": "10.7.0.2/32", "fd00:7::2/64": "fd00:7::2/128"}[a]
					}
					ad, _ := netlink.ParseAddr(a)
					ad.Flags = unix.IFA_F_NODAD
					if err := netlink.AddrAdd(e, ad); err != nil {
						return err
					}
				}
				return netlink.LinkSetUp(e)
			})
			if err != nil {
				t.Fatal(err)
			}
			topo, err := DiscoverIn(host)
			if err != nil {
				t.Fatal(err)
			}
			got := map[netip.Addr]Endpoint{}
			for _, e := range topo.Endpoints {
				got[e.IP] = e
			}
			if len(topo.Endpoints) != 2 {
				t.Fatalf("want the pod's two addresses as endpoints, got %+v", topo.Endpoints)
			}
			for _, a := range []netip.Addr{pod4, pod6} {
				e, ok := got[a]
				if !ok || e.Dev != hostVeth || !bytes.Equal(e.MAC, podMAC) || e.VNI != 4096 || e.Skip == "" {
					t.Fatalf("endpoint %s: %+v (all: %+v)", a, e, topo.Endpoints)
				}
			}

			// Without a namespace file the pod is found only once the
			// host has a neighbour entry for it.
			if err := vnetns.DeleteNamed(filepath.Base(pod)); err != nil {
				t.Fatal(err)
			}
			if topo, err = DiscoverIn(host); err != nil {
				t.Fatal(err)
			}
			if len(topo.Endpoints) != 0 {
				t.Fatalf("pod without a namespace file and no neighbour entry: want no endpoint, got %+v", topo.Endpoints)
			}
			err = netns.Do(host, false, func() error {
				dev := hostVeth
				if bridged {
					dev = "cni0"
					hv, _ := netlink.LinkByName(hostVeth)
					if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: hv.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_REACHABLE,
						Flags: netlink.NTF_MASTER, HardwareAddr: podMAC}); err != nil {
						return err
					}
				}
				l, _ := netlink.LinkByName(dev)
				return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_REACHABLE,
					IP: pod4.AsSlice(), HardwareAddr: podMAC})
			})
			if err != nil {
				t.Fatal(err)
			}
			if topo, err = DiscoverIn(host); err != nil {
				t.Fatal(err)
			}
			if len(topo.Endpoints) != 1 || topo.Endpoints[0].IP != pod4 || topo.Endpoints[0].Dev != hostVeth || !bytes.Equal(topo.Endpoints[0].MAC, podMAC) {
				t.Fatalf("from the neighbour table: %+v", topo.Endpoints)
			}
		})
	}
}

// TestDiscoverUnderLinkChurn: discovery while links come and go (pods
// created beside a watcher's sync) reads the topology again when the
// kernel interrupts one of its netlink dumps ("results may be incomplete
// or inconsistent"), instead of failing the sync. 300 links make the link
// dump span several messages, so a change between two of them interrupts
// it.
func TestDiscoverUnderLinkChurn(t *testing.T) {
	testbedtest.RequireRoot(t)
	host := newNamedNS(t)
	err := netns.Do(host, false, func() error {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan.calico", MTU: 1450}, VxlanId: 4096, SrcAddr: net.IPv4(198, 18, 9, 2), Port: 4789}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		for i := range 150 { // veth pairs (this kernel has no dummy driver)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("d%d", i)}, PeerName: fmt.Sprintf("p%d", i)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	churned := make(chan error, 1)
	go func() {
		churned <- netns.Do(host, false, func() error {
			deadline := time.Now().Add(10 * time.Second) // bounded even if the test fails early
			for i := 0; time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "churn"}, PeerName: "churnpeer"}
				if err := netlink.LinkAdd(d); err != nil {
					return err
				}
				if err := netlink.LinkDel(d); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	defer func() {
		close(stop)
		if err := <-churned; err != nil {
			t.Errorf("churn: %v", err)
		}
	}()
	for i := range 200 {
		if err := netns.Do(host, false, func() error { _, err := Discover(); return err }); err != nil {
			t.Fatalf("discovery %d under link churn: %v", i, err)
		}
	}
}
