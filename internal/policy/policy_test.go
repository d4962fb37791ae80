package policy

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Dst: "10.0.0.300/24"}, "bad CIDR"},
		{Spec{Dst: "10.0.0.1/24"}, "host bits set, did you mean 10.0.0.0/24"},
		{Spec{Dst: "10.0.0.0/33"}, "bad CIDR"},
		{Spec{Dst: "banana"}, "bad IP address"},
		{Spec{Dst: "10.0.0.1", Port: "0"}, "0 is out of range"},
		{Spec{Dst: "10.0.0.1", Port: "65536"}, "65536 is out of range"},
		{Spec{Dst: "10.0.0.1", Port: "90-80"}, "backwards"},
		{Spec{Dst: "10.0.0.1", Port: "http"}, "want N or N-M"},
		{Spec{Dst: "10.0.0.1", Proto: "sctp"}, "want udp, tcp, icmp or any"},
		{Spec{Dst: "10.0.0.1", Proto: "icmp", Port: "80"}, "icmp has no ports"},
		{Spec{Dst: "10.0.0.1", VNI: "16777216"}, "want 1..16777215"},
		{Spec{Dst: "10.0.0.1", VNI: "x"}, "not a number"},
		{Spec{Dst: "10.0.0.1", Src: "fd00::1"}, "different IP families"},
		{Spec{}, "matches everything"},
	} {
		_, err := Parse(tc.spec)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%+v) = %v, want error containing %q", tc.spec, err, tc.want)
		}
	}
}

func mustParse(t *testing.T, s Spec) Rule {
	t.Helper()
	r, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAddConflicts(t *testing.T) {
	var s Set
	base := mustParse(t, Spec{Dst: "198.19.0.0/24", Proto: "udp", Port: "7000-7010"})
	if r, err := s.Add(base); err != nil || r.ID != 0 {
		t.Fatalf("add: %v %v", r, err)
	}
	for _, tc := range []struct {
		spec Spec
		want string // "" = no conflict
	}{
		{Spec{Dst: "198.19.0.0/24", Proto: "udp", Port: "7000-7010"}, "duplicate of rule 0"},
		{Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7005"}, "overlaps rule 0"},
		{Spec{Dst: "198.19.0.2", Port: "7010-7020"}, "overlaps rule 0"}, // any proto with ports: udp+tcp
		{Spec{Src: "10.0.0.0/8"}, "overlaps rule 0"},
		{Spec{Dst: "198.19.0.2", Proto: "tcp", Port: "7005"}, ""},
		{Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7011"}, ""},
		{Spec{Dst: "198.19.1.0/24", Proto: "udp", Port: "7000"}, ""},
		{Spec{Dst: "fd00::/64", Proto: "udp", Port: "7000"}, ""},
		{Spec{Dst: "198.19.0.2", Proto: "icmp"}, ""},
	} {
		var c Set
		c.Rules = append(c.Rules, s.Rules...)
		_, err := c.Add(mustParse(t, tc.spec))
		if tc.want == "" && err != nil {
			t.Errorf("%+v: unexpected %v", tc.spec, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: got %v, want %q", tc.spec, err, tc.want)
		}
	}
	// Rules with different VNIs do not overlap.
	a := mustParse(t, Spec{Dst: "10.1.0.1", VNI: "1"})
	b := mustParse(t, Spec{Dst: "10.1.0.1", VNI: "2"})
	if Overlaps(a, b) {
		t.Error("different VNIs overlap")
	}
	if !Overlaps(a, mustParse(t, Spec{Dst: "10.1.0.0/16"})) {
		t.Error("any VNI does not overlap a VNI")
	}
}

func TestIDsAndDel(t *testing.T) {
	var s Set
	for _, d := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		if _, err := s.Add(mustParse(t, Spec{Dst: d})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Del(1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Del(1); !errors.Is(err, ErrNoRule) {
		t.Fatalf("second del: %v", err)
	}
	r, _ := s.Add(mustParse(t, Spec{Dst: "10.0.0.4"}))
	if r.ID != 1 {
		t.Fatalf("reused id %d, want 1", r.ID)
	}
	for i := 4; len(s.Rules) < MaxRules; i++ {
		if _, err := s.Add(mustParse(t, Spec{Dst: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String()})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Add(mustParse(t, Spec{Dst: "10.2.0.1"})); err == nil || !strings.Contains(err.Error(), "at most 64") {
		t.Fatalf("rule 65: %v", err)
	}
}

func TestStateRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "rules.json")
	s, err := Load(p)
	if err != nil || len(s.Rules) != 0 {
		t.Fatalf("load missing: %v %v", s, err)
	}
	// add stores a rule as lanes.Store does: load, add, save.
	add := func(sp Spec) error {
		s, err := Load(p)
		if err != nil {
			return err
		}
		if _, err := s.Add(mustParse(t, sp)); err != nil {
			return err
		}
		return Save(p, s)
	}
	if err := add(Spec{Dst: "fd00::/64", Proto: "tcp", Port: "80-90", VNI: "42"}); err != nil {
		t.Fatal(err)
	}
	if err := add(Spec{Dst: "fd00::1", Proto: "tcp", Port: "85"}); err == nil {
		t.Fatal("overlapping rule saved")
	}
	got, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Rules) != 1 || got.Rules[0].String() != "dst fd00::/64 proto tcp port 80-90 vni 42" {
		t.Fatalf("round trip: %+v", got.Rules)
	}
}

func TestCompile(t *testing.T) {
	var s Set
	for _, sp := range []Spec{
		{Dst: "198.19.0.0/24", Proto: "udp", Port: "7000"}, // 0
		{Dst: "198.19.0.2", Proto: "tcp"},                  // 1
		{Src: "198.18.0.0/16", Proto: "icmp", VNI: "42"},   // 2
		{Dst: "fd00::/64", Port: "443"},                    // 3
	} {
		if _, err := s.Add(mustParse(t, sp)); err != nil {
			t.Fatal(err)
		}
	}
	tb := Compile(&s)
	p24 := To128(netip.MustParsePrefix("198.19.0.0/24"))
	p32 := To128(netip.MustParsePrefix("198.19.0.2/32"))
	if tb.Dst[p24] != 1|4 || tb.Dst[p32] != 1|2|4 || tb.Dst[all128] != 4 {
		t.Errorf("dst masks: %v", tb.Dst)
	}
	if p32.Bits() != 128 || p24.Bits() != 120 {
		t.Errorf("v4 prefixes not mapped: %v %v", p24, p32)
	}
	if tb.Ports[ClassUDP*65536+7000] != 1 || tb.Ports[ClassUDP*65536+443] != 8 || tb.Ports[ClassTCP*65536+443] != 8 {
		t.Errorf("ports: %v", tb.Ports)
	}
	if tb.Protos[ClassTCP] != 2 || tb.Protos[ClassICMP] != 4 || tb.Protos[ClassUDP] != 0 {
		t.Errorf("protos: %v", tb.Protos)
	}
	if tb.VNIMask(42) != 15 || tb.VNIMask(7) != 11 {
		t.Errorf("vni masks %x %x", tb.VNIMask(42), tb.VNIMask(7))
	}
}
