package workload

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestRules(t *testing.T) {
	for _, c := range []struct {
		name string
		w    Workload
		want []string // rule strings
	}{
		{"default lane", Workload{Source: SourceCNI, ID: "a", IPs: addrs("10.244.1.5")}, nil},
		{"explicit default", Workload{Source: SourceCNI, ID: "a", IPs: addrs("10.244.1.5"), Lane: "default"}, nil},
		{"high, every port", Workload{Source: SourceCNI, ID: "a", IPs: addrs("10.244.1.5"), Lane: "high"},
			[]string{"dst 10.244.1.5/32"}},
		{"high, ports, both families, duplicate address", Workload{Source: SourceKubernetes, ID: "u", Lane: " High ",
			IPs: addrs("10.244.1.5", "fd00::5", "10.244.1.5"), Ports: "5201, 8080-8090", Proto: "udp"},
			[]string{"dst 10.244.1.5/32 proto udp port 5201", "dst 10.244.1.5/32 proto udp port 8080-8090",
				"dst fd00::5/128 proto udp port 5201", "dst fd00::5/128 proto udp port 8080-8090"}},
		{"v4-mapped written as v4", Workload{Source: SourceDocker, ID: "c", Lane: "high", IPs: addrs("::ffff:10.0.0.7")},
			[]string{"dst 10.0.0.7/32"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.w.Validate(); err != nil {
				t.Fatal(err)
			}
			rs, err := c.w.Rules()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rs {
				got = append(got, r.String())
			}
			if strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Errorf("rules %q, want %q", got, c.want)
			}
		})
	}
}

func TestInvalid(t *testing.T) {
	ip := addrs("10.0.0.1")
	for _, c := range []struct {
		w    Workload
		want string
	}{
		{Workload{Source: "podman", ID: "a"}, `source "podman"`},
		{Workload{Source: SourceCNI}, "no ID"},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Lane: "turbo"}, `lane "turbo": want high or default`},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Ports: "80"}, "without lane"},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Lane: "high", Proto: "icmp"}, `proto "icmp"`},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Lane: "high", Ports: "80,,81"}, "empty item"},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Lane: "high", Ports: "0"}, "out of range"},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Lane: "high", Ports: "90-80"}, "backwards"},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Lane: "high", Ports: "80-90,85"}, "overlap"},
		{Workload{Source: SourceCNI, ID: "a", IPs: ip, Lane: "high", Ports: "1,2,3,4,5,6,7,8,9"}, "at most 8"},
		{Workload{Source: SourceCNI, ID: "a", IPs: []netip.Addr{{}}, Lane: "high"}, "address"},
	} {
		err := c.w.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want ErrInvalid with %q", c.w, err, c.want)
		}
	}
}

func TestOverlapping(t *testing.T) {
	old := Workload{Source: SourceDocker, ID: "old", Lane: "high", IPs: addrs("10.0.0.2")}
	other := Workload{Source: SourceDocker, ID: "other", Lane: "high", IPs: addrs("10.0.0.3")}
	plain := Workload{Source: SourceDocker, ID: "plain", IPs: addrs("10.0.0.2")}
	m := map[string]Workload{old.Key(): old, other.Key(): other, plain.Key(): plain}
	reuse := Workload{Source: SourceCNI, ID: "new", Lane: "high", IPs: addrs("10.0.0.2"), Ports: "80", Proto: "tcp"}
	if got := Overlapping(reuse, m); len(got) != 1 || got[0] != old.Key() {
		t.Errorf("overlapping %v, want [%s]", got, old.Key())
	}
	if got := Overlapping(plain, m); got != nil {
		t.Errorf("a workload without a lane overlaps %v", got)
	}
}

func TestFromMetadata(t *testing.T) {
	lane, ports, proto := FromMetadata(map[string]string{AnnotationLane: " high", AnnotationPorts: "5201 "}, AnnotationLane, AnnotationPorts, AnnotationProto)
	if lane != "high" || ports != "5201" || proto != "" {
		t.Errorf("got %q %q %q", lane, ports, proto)
	}
}
