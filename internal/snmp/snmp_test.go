package snmp

import (
	"strings"
	"testing"
)

const sample = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
Udp: 42 1 6 9 5 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
UdpLite: 0 0 0 0 0 0
Tcp: RtoAlgorithm InSegs RetransSegs
Tcp: 1 300 17
`

func TestValue(t *testing.T) {
	for key, want := range map[string]uint64{"Udp:InDatagrams": 42, "Udp:RcvbufErrors": 5, "Tcp:RetransSegs": 17, "Ip:InReceives": 100} {
		if v, ok := Value(sample, key); !ok || v != want {
			t.Errorf("%s: %d %v, want %d", key, v, ok, want)
		}
	}
	// UdpLite's line must not answer for Udp, nor a field another
	// protocol has.
	for _, key := range []string{"Tcp:RcvbufErrors", "Udp:Nope", "Sctp:InDatagrams"} {
		if v, ok := Value(sample, key); ok {
			t.Errorf("%s: found %d, want absent", key, v)
		}
	}
	if v, ok := Value("Udp6InDatagrams 4\nUdp6RcvbufErrors 11\n", "Udp6RcvbufErrors"); !ok || v != 11 {
		t.Errorf("snmp6: %d %v, want 11", v, ok)
	}
}

func TestReadNamesMissing(t *testing.T) {
	m, err := Read(Path, "Udp:InDatagrams", "Tcp:InSegs")
	if err != nil || len(m) != 2 {
		t.Fatalf("this namespace's counters: %v %v", m, err)
	}
	if _, err := Read(Path, "Udp:NoSuchCounter"); err == nil || !strings.Contains(err.Error(), "Udp:NoSuchCounter") {
		t.Fatalf("a missing counter: %v", err)
	}
}
