// Package policy holds the high-priority rules of rxlane's priority lanes:
// parse, validate, store in a state file, compile to the tables the lane's
// BPF maps hold, and apply those tables to the maps at runtime without
// reattaching anything (PRISM's /proc database, as BPF maps).
//
// A rule matches inner packets by destination and source prefix, protocol,
// destination port or port range, and VNI; unset fields match anything.
// Rules may not overlap, so a packet matches at most one rule and per-rule
// counters are exact.
package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// MaxRules is the number of rules the datapath holds (one bit per rule).
const MaxRules = 64

// Protocols a rule may name.
const (
	ProtoAny  = ""
	ProtoUDP  = "udp"
	ProtoTCP  = "tcp"
	ProtoICMP = "icmp" // ICMP and ICMPv6
)

// Rule is one high-priority rule. The zero value of a field matches
// anything.
type Rule struct {
	// ID is the rule's slot in the datapath, 0..MaxRules-1, assigned by
	// Set.Add; counters are kept per ID.
	ID     int          `json:"id"`
	Dst    netip.Prefix `json:"dst,omitzero"`
	Src    netip.Prefix `json:"src,omitzero"`
	Proto  string       `json:"proto,omitempty"`
	PortLo uint16       `json:"port_lo,omitempty"`
	PortHi uint16       `json:"port_hi,omitempty"`
	VNI    uint32       `json:"vni,omitempty"`
}

// Spec is a rule as a person writes it (CLI flags).
type Spec struct {
	Dst   string // IP or CIDR
	Src   string // IP or CIDR
	Proto string // udp, tcp, icmp, any or ""
	Port  string // N or N-M (destination port)
	VNI   string // 1..16777215
}

// ErrInvalid marks every validation error.
var ErrInvalid = errors.New("invalid rule")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Parse turns a Spec into a validated Rule (ID 0; Set.Add assigns it).
func Parse(s Spec) (Rule, error) {
	var r Rule
	var err error
	if r.Dst, err = parsePrefix("dst", s.Dst); err != nil {
		return Rule{}, err
	}
	if r.Src, err = parsePrefix("src", s.Src); err != nil {
		return Rule{}, err
	}
	switch p := strings.ToLower(strings.TrimSpace(s.Proto)); p {
	case "", "any":
		r.Proto = ProtoAny
	case ProtoUDP, ProtoTCP, ProtoICMP:
		r.Proto = p
	default:
		return Rule{}, invalid("proto %q: want udp, tcp, icmp or any", s.Proto)
	}
	if s.Port != "" {
		if r.PortLo, r.PortHi, err = parsePorts(s.Port); err != nil {
			return Rule{}, err
		}
	}
	if s.VNI != "" {
		v, err := strconv.ParseUint(strings.TrimSpace(s.VNI), 10, 32)
		if err != nil {
			return Rule{}, invalid("vni %q: not a number", s.VNI)
		}
		r.VNI = uint32(v)
	}
	return r, r.Validate()
}

func parsePrefix(field, s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "any" {
		return netip.Prefix{}, nil
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, invalid("%s %q: bad CIDR (want e.g. 10.0.0.0/24 or fd00::/64)", field, s)
		}
		if p.Masked() != p {
			return netip.Prefix{}, invalid("%s %q: host bits set, did you mean %s?", field, s, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, invalid("%s %q: bad IP address", field, s)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, invalid("%s %q: zones are not allowed", field, s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parsePorts(s string) (uint16, uint16, error) {
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if !isRange {
		hi = lo
	}
	l, err1 := strconv.Atoi(strings.TrimSpace(lo))
	h, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if err1 != nil || err2 != nil {
		return 0, 0, invalid("port %q: want N or N-M", s)
	}
	for _, p := range []int{l, h} {
		if p < 1 || p > 65535 {
			return 0, 0, invalid("port %q: %d is out of range 1..65535", s, p)
		}
	}
	if l > h {
		return 0, 0, invalid("port %q: range is backwards", s)
	}
	return uint16(l), uint16(h), nil
}

// HasPorts reports whether the rule names ports.
func (r Rule) HasPorts() bool { return r.PortLo != 0 }

// Validate checks one rule on its own.
func (r Rule) Validate() error {
	if r.ID < 0 || r.ID >= MaxRules {
		return invalid("id %d: want 0..%d", r.ID, MaxRules-1)
	}
	for _, f := range []struct {
		name string
		p    netip.Prefix
	}{{"dst", r.Dst}, {"src", r.Src}} {
		if f.p.IsValid() && f.p.Masked() != f.p {
			return invalid("%s %s: host bits set", f.name, f.p)
		}
		if f.p.IsValid() && f.p.Addr().Is4In6() {
			return invalid("%s %s: write IPv4 as IPv4", f.name, f.p)
		}
	}
	if r.Dst.IsValid() && r.Src.IsValid() && r.Dst.Addr().Is4() != r.Src.Addr().Is4() {
		return invalid("dst %s and src %s are of different IP families", r.Dst, r.Src)
	}
	switch r.Proto {
	case ProtoAny, ProtoUDP, ProtoTCP, ProtoICMP:
	default:
		return invalid("proto %q: want udp, tcp, icmp or any", r.Proto)
	}
	if (r.PortLo == 0) != (r.PortHi == 0) || r.PortLo > r.PortHi {
		return invalid("ports %d-%d: want 1..65535, low <= high", r.PortLo, r.PortHi)
	}
	if r.HasPorts() && r.Proto == ProtoICMP {
		return invalid("icmp has no ports")
	}
	if r.VNI > 1<<24-1 {
		return invalid("vni %d: want 1..16777215", r.VNI)
	}
	if !r.Dst.IsValid() && !r.Src.IsValid() && r.Proto == ProtoAny && !r.HasPorts() {
		return invalid("rule matches everything: name at least a dst, src, proto or port")
	}
	return nil
}

// String renders a rule the way the CLI reads it.
func (r Rule) String() string {
	var parts []string
	if r.Dst.IsValid() {
		parts = append(parts, "dst "+r.Dst.String())
	}
	if r.Src.IsValid() {
		parts = append(parts, "src "+r.Src.String())
	}
	if r.Proto != "" {
		parts = append(parts, "proto "+r.Proto)
	}
	if r.HasPorts() {
		if r.PortLo == r.PortHi {
			parts = append(parts, fmt.Sprintf("port %d", r.PortLo))
		} else {
			parts = append(parts, fmt.Sprintf("port %d-%d", r.PortLo, r.PortHi))
		}
	}
	if r.VNI != 0 {
		parts = append(parts, fmt.Sprintf("vni %d", r.VNI))
	}
	return strings.Join(parts, " ")
}

// sameMatch reports whether two rules match exactly the same packets.
func sameMatch(a, b Rule) bool {
	a.ID, b.ID = 0, 0
	return a == b
}

// Overlaps reports whether some packet matches both rules.
func Overlaps(a, b Rule) bool {
	pfx := func(x, y netip.Prefix) bool { return !x.IsValid() || !y.IsValid() || x.Overlaps(y) }
	// A rule with an IPv4 dst cannot match IPv6 packets, even if its src is
	// unset: the family is a property of the packet.
	fam := func(r Rule) int {
		for _, p := range []netip.Prefix{r.Dst, r.Src} {
			if p.IsValid() {
				if p.Addr().Is4() {
					return 4
				}
				return 6
			}
		}
		return 0
	}
	fa, fb := fam(a), fam(b)
	if fa != 0 && fb != 0 && fa != fb {
		return false
	}
	if !pfx(a.Dst, b.Dst) || !pfx(a.Src, b.Src) {
		return false
	}
	if a.VNI != 0 && b.VNI != 0 && a.VNI != b.VNI {
		return false
	}
	protos := func(r Rule) map[string]bool {
		if r.Proto != ProtoAny {
			return map[string]bool{r.Proto: true}
		}
		if r.HasPorts() {
			return map[string]bool{ProtoUDP: true, ProtoTCP: true}
		}
		return map[string]bool{ProtoUDP: true, ProtoTCP: true, ProtoICMP: true, "other": true}
	}
	pa, pb := protos(a), protos(b)
	common := false
	for p := range pa {
		if pb[p] {
			common = true
		}
	}
	if !common {
		return false
	}
	if a.HasPorts() && b.HasPorts() {
		return a.PortLo <= b.PortHi && b.PortLo <= a.PortHi
	}
	return true
}

// Set is an ordered collection of non-overlapping rules.
type Set struct {
	Rules []Rule `json:"rules"`
}

// Validate checks every rule and every pair.
func (s *Set) Validate() error {
	if len(s.Rules) > MaxRules {
		return invalid("%d rules: at most %d", len(s.Rules), MaxRules)
	}
	ids := map[int]bool{}
	for i, r := range s.Rules {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("rule %d: %w", r.ID, err)
		}
		if ids[r.ID] {
			return invalid("id %d used twice", r.ID)
		}
		ids[r.ID] = true
		for _, o := range s.Rules[:i] {
			if err := conflict(o, r); err != nil {
				return err
			}
		}
	}
	return nil
}

func conflict(old, r Rule) error {
	if sameMatch(old, r) {
		return invalid("duplicate of rule %d (%s)", old.ID, old)
	}
	if Overlaps(old, r) {
		return invalid("overlaps rule %d (%s): some packets would match both; narrow one of them", old.ID, old)
	}
	return nil
}

// Add validates r against the set, gives it the lowest free ID and appends
// it. It returns the stored rule.
func (s *Set) Add(r Rule) (Rule, error) {
	if len(s.Rules) >= MaxRules {
		return Rule{}, invalid("a lane holds at most %d rules (one bit each in the classifier's 64-bit masks): delete one first (rxlane lanes del ID)", MaxRules)
	}
	used := map[int]bool{}
	for _, o := range s.Rules {
		used[o.ID] = true
	}
	r.ID = 0
	for used[r.ID] {
		r.ID++
	}
	if err := r.Validate(); err != nil {
		return Rule{}, err
	}
	for _, o := range s.Rules {
		if err := conflict(o, r); err != nil {
			return Rule{}, err
		}
	}
	s.Rules = append(s.Rules, r)
	sort.Slice(s.Rules, func(i, j int) bool { return s.Rules[i].ID < s.Rules[j].ID })
	return r, nil
}

// ErrNoRule is returned by Del for an unknown ID.
var ErrNoRule = errors.New("no such rule")

// Del removes the rule with the given ID.
func (s *Set) Del(id int) (Rule, error) {
	for i, r := range s.Rules {
		if r.ID == id {
			s.Rules = append(s.Rules[:i], s.Rules[i+1:]...)
			return r, nil
		}
	}
	return Rule{}, fmt.Errorf("rule %d: %w", id, ErrNoRule)
}
