package overlay

import (
	"bufio"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Ruleset is one iptables-save (or ip6tables-save) dump: its tables by
// name ("filter", "nat", ...). It is parsed only to be evaluated by
// Ruleset.Check: the rules are kept as the tool printed them.
type Ruleset struct {
	// Tool is the command the dump came from ("iptables-save"), named
	// in the reasons Check gives.
	Tool   string
	Tables map[string]*Table
}

// Table is one "*table" section of a dump.
type Table struct {
	Name   string
	Chains map[string]*Chain
}

// Chain is a built-in chain (Policy ACCEPT or DROP) or a user chain
// (Policy "-").
type Chain struct {
	Name   string
	Policy string
	Rules  []Rule
}

// Rule is one "-A CHAIN ..." line, split into what Check understands:
// the addresses and interfaces it matches, whether it has matchers Check
// does not understand (Unknown), and its target.
type Rule struct {
	// Text is the rule as saved, without "-A CHAIN" and without its
	// comment (for the reasons Check gives).
	Text string
	Src  addrMatch
	Dst  addrMatch
	In   ifMatch
	Out  ifMatch
	// DstType is an addrtype match on the destination alone
	// ("LOCAL", negated with Not): the only matcher module understood.
	DstType addrTypeMatch
	// Unknown names the first matcher Check cannot evaluate (a protocol,
	// a module): such a rule may match any packet.
	Unknown string
	// Target is the -j or -g target ("" for none); Goto is -g.
	Target string
	Goto   bool
}

type addrMatch struct {
	Set    bool
	Not    bool
	Prefix netip.Prefix
}

type ifMatch struct {
	Set  bool
	Not  bool
	Name string // iptables' syntax: a trailing "+" matches any suffix
}

type addrTypeMatch struct {
	Set  bool
	Not  bool
	Type string
}

// ParseIptablesSave parses the output of iptables-save or ip6tables-save
// (either backend). Anything it cannot parse is an error: a rule misread
// could prove a path that is not safe.
func ParseIptablesSave(tool, text string) (*Ruleset, error) {
	rs := &Ruleset{Tool: tool, Tables: map[string]*Table{}}
	var cur *Table
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			// iptables-nft-save flags tables it cannot show as iptables
			// rules (made by nft itself): those are unread rules.
			if strings.Contains(line, "incompatible") {
				return nil, fmt.Errorf("%s line %d: %s", tool, n, strings.TrimPrefix(line, "# "))
			}
		case strings.HasPrefix(line, "*"):
			name := line[1:]
			cur = &Table{Name: name, Chains: map[string]*Chain{}}
			if rs.Tables[name] != nil {
				return nil, fmt.Errorf("%s line %d: table %s twice", tool, n, name)
			}
			rs.Tables[name] = cur
		case line == "COMMIT":
			cur = nil
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if cur == nil || len(f) < 2 {
				return nil, fmt.Errorf("%s line %d: chain %q outside a table", tool, n, line)
			}
			if cur.Chains[f[0]] != nil {
				return nil, fmt.Errorf("%s line %d: chain %s declared twice", tool, n, f[0])
			}
			cur.Chains[f[0]] = &Chain{Name: f[0], Policy: f[1]}
		case strings.HasPrefix(line, "-A "):
			toks, err := splitRule(line)
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", tool, n, err)
			}
			if cur == nil || len(toks) < 2 {
				return nil, fmt.Errorf("%s line %d: rule outside a table", tool, n)
			}
			c := cur.Chains[toks[1]]
			if c == nil {
				return nil, fmt.Errorf("%s line %d: rule in undeclared chain %s", tool, n, toks[1])
			}
			r, err := parseRule(toks[2:])
			if err != nil {
				return nil, fmt.Errorf("%s line %d (%s): %w", tool, n, line, err)
			}
			c.Rules = append(c.Rules, r)
		default:
			return nil, fmt.Errorf("%s line %d: not understood: %q", tool, n, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s output: %w", tool, err)
	}
	if cur != nil {
		return nil, fmt.Errorf("%s: table %s has no COMMIT (output cut short?)", tool, cur.Name)
	}
	return rs, nil
}

// splitRule splits a saved rule into words as the shell would: iptables
// quotes words with spaces ("flanneld forward") and escapes quotes in
// them.
func splitRule(line string) ([]string, error) {
	var out []string
	var w strings.Builder
	in, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			in = true
		case c == '"':
			quoted = !quoted
			in = true
		case (c == ' ' || c == '\t') && !quoted:
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote")
	}
	if in {
		out = append(out, w.String())
	}
	return out, nil
}

// topFlag is a flag of iptables itself (not of a match module), as
// iptables-save prints them.
func topFlag(s string) bool {
	switch s {
	case "-s", "-d", "-i", "-o", "-p", "-f", "-m", "-j", "-g",
		"--source", "--destination", "--in-interface", "--out-interface", "--protocol", "--fragment", "--match", "--jump", "--goto":
		return true
	}
	return false
}

func parseRule(toks []string) (Rule, error) {
	var r Rule
	var text []string
	unknown := func(what string) {
		if r.Unknown == "" {
			r.Unknown = what
		}
	}
	not := false
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		arg := func() (string, error) {
			if i+1 >= len(toks) {
				return "", fmt.Errorf("%s without a value", t)
			}
			i++
			return toks[i], nil
		}
		neg := ""
		if not {
			neg = "! "
		}
		switch t {
		case "!":
			if not {
				return r, fmt.Errorf("two '!' in a row")
			}
			not = true
			continue
		case "-s", "--source", "-d", "--destination":
			v, err := arg()
			if err != nil {
				return r, err
			}
			p, err := parseAddr(v)
			if err != nil {
				return r, fmt.Errorf("%s %s: %w", t, v, err)
			}
			m := addrMatch{Set: true, Not: not, Prefix: p}
			if t == "-s" || t == "--source" {
				r.Src = m
			} else {
				r.Dst = m
			}
			text = append(text, neg+t+" "+v)
		case "-i", "--in-interface", "-o", "--out-interface":
			v, err := arg()
			if err != nil {
				return r, err
			}
			m := ifMatch{Set: true, Not: not, Name: v}
			if t == "-i" || t == "--in-interface" {
				r.In = m
			} else {
				r.Out = m
			}
			text = append(text, neg+t+" "+v)
		case "-p", "--protocol":
			v, err := arg()
			if err != nil {
				return r, err
			}
			// The lane serves any protocol a rule of the operator's
			// names: a protocol match may match its packets.
			unknown(neg + "-p " + v)
			text = append(text, neg+"-p "+v)
		case "-f", "--fragment":
			unknown(neg + "-f")
			text = append(text, neg+"-f")
		case "-m", "--match":
			if not {
				return r, fmt.Errorf("'!' before -m")
			}
			name, err := arg()
			if err != nil {
				return r, err
			}
			// The module's options run to the next flag of iptables'
			// own (a value may start with "-": a comment, a number).
			j := i + 1
			for j < len(toks) && !topFlag(toks[j]) && !(toks[j] == "!" && j+1 < len(toks) && topFlag(toks[j+1])) {
				if toks[j] == "--comment" && name == "comment" {
					j++ // its value, whatever it looks like
				}
				j++
			}
			opts := toks[i+1 : min(j, len(toks))]
			i = j - 1
			if name == "comment" {
				continue
			}
			desc := strings.TrimSpace("-m " + name + " " + strings.Join(opts, " "))
			text = append(text, desc)
			if name == "addrtype" && len(opts) == 2 && opts[0] == "--dst-type" && !r.DstType.Set {
				r.DstType = addrTypeMatch{Set: true, Type: opts[1]}
				continue
			}
			if name == "addrtype" && len(opts) == 3 && opts[0] == "!" && opts[1] == "--dst-type" && !r.DstType.Set {
				r.DstType = addrTypeMatch{Set: true, Not: true, Type: opts[2]}
				continue
			}
			unknown(desc)
		case "-j", "--jump", "-g", "--goto":
			if not {
				return r, fmt.Errorf("'!' before %s", t)
			}
			v, err := arg()
			if err != nil {
				return r, err
			}
			r.Target, r.Goto = v, t == "-g" || t == "--goto"
			text = append(text, strings.Join(append([]string{t}, toks[i:]...), " "))
			i = len(toks)
		case "-c", "--set-counters":
			i += 2
		default:
			return r, fmt.Errorf("%q not understood", t)
		}
		not = false
	}
	if not {
		return r, fmt.Errorf("'!' at the end")
	}
	r.Text = strings.Join(text, " ")
	return r, nil
}

// parseAddr reads an address as iptables-save prints it: a prefix, a
// bare address, or an IPv4 address with a dotted mask (contiguous only).
func parseAddr(s string) (netip.Prefix, error) {
	a, m, hasMask := strings.Cut(s, "/")
	ip, err := netip.ParseAddr(a)
	if err != nil {
		return netip.Prefix{}, err
	}
	bits := ip.BitLen()
	if hasMask {
		if n, err := strconv.Atoi(m); err == nil {
			bits = n
		} else {
			mask, err := netip.ParseAddr(m)
			if err != nil || !mask.Is4() {
				return netip.Prefix{}, fmt.Errorf("mask %q", m)
			}
			b := mask.As4()
			v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
			bits = 0
			for v&(1<<31) != 0 {
				bits++
				v <<= 1
			}
			if v != 0 {
				return netip.Prefix{}, fmt.Errorf("mask %s is not contiguous", m)
			}
		}
	}
	return ip.Prefix(bits)
}

// Packets is the class of packets Check evaluates: forwarded from In to
// Out, to Dst, from any source, any protocol. DstLocal says whether Dst
// is an address of the node (addrtype LOCAL).
type Packets struct {
	In, Out  string
	Dst      netip.Addr
	DstLocal bool
}

type tri int

const (
	cannot tri = iota
	may
	surely
)

func (m ifMatch) eval(dev string) tri {
	if !m.Set {
		return surely
	}
	hit := dev == m.Name
	if p, ok := strings.CutSuffix(m.Name, "+"); ok {
		hit = strings.HasPrefix(dev, p)
	}
	if hit != m.Not {
		return surely
	}
	return cannot
}

// match decides whether r matches every packet of p (surely), none
// (cannot), or some (may), by everything but the source address (which
// the evaluator follows as a set, srcSet).
func (r *Rule) match(p Packets) tri {
	res := surely
	and := func(t tri) { res = min(res, t) }
	if r.Src.Set && r.Src.Prefix.Addr().Is4() != p.Dst.Is4() {
		and(cannot)
	}
	if r.Dst.Set {
		if r.Dst.Prefix.Addr().Is4() != p.Dst.Is4() || r.Dst.Prefix.Contains(p.Dst) == r.Dst.Not {
			and(cannot)
		}
	}
	and(r.In.eval(p.In))
	and(r.Out.eval(p.Out))
	if r.DstType.Set {
		if r.DstType.Type != "LOCAL" {
			and(may)
		} else if p.DstLocal == r.DstType.Not {
			and(cannot)
		}
	}
	if r.Unknown != "" {
		and(may)
	}
	return res
}

// srcSet is a set of source addresses: the union of its prefixes (which
// may overlap). The evaluator follows which sources may reach each rule,
// so that rules that together cover every source (Flannel's "-s P -j
// RETURN" then "! -s P -j RETURN") are seen to.
type srcSet []netip.Prefix

// split divides s by prefix p (negated with not) into the sources a
// "-s p" matches and those it does not.
func (s srcSet) split(p netip.Prefix, not bool) (in, out srcSet) {
	for _, q := range s {
		switch {
		case p.Bits() <= q.Bits() && p.Contains(q.Addr()): // q inside p
			in = append(in, q)
		case q.Bits() < p.Bits() && q.Contains(p.Addr()): // p inside q
			in = append(in, p)
			// q minus p: at each level below q, the half without p.
			for b := q.Bits() + 1; b <= p.Bits(); b++ {
				half, _ := p.Addr().Prefix(b)
				out = append(out, sibling(half))
			}
		default:
			out = append(out, q)
		}
	}
	if not {
		in, out = out, in
	}
	return in, out
}

// maxSrcs bounds a source set's prefixes (and the evaluator's work on
// rulesets of thousands of source matches).
const maxSrcs = 4096

// sibling is the other half of the prefix one bit shorter than h.
func sibling(h netip.Prefix) netip.Prefix {
	b := h.Addr().AsSlice()
	bit := h.Bits() - 1
	b[bit/8] ^= 0x80 >> (bit % 8)
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, h.Bits())
}

// Chains a packet forwarded through the node traverses, per table, in
// the order the kernel's hooks run them.
var forwardChains = []struct{ table, chain string }{
	{"raw", "PREROUTING"},
	{"mangle", "PREROUTING"},
	{"nat", "PREROUTING"},
	{"mangle", "FORWARD"},
	{"filter", "FORWARD"},
	{"security", "FORWARD"},
	{"mangle", "POSTROUTING"},
	{"nat", "POSTROUTING"},
}

// Check proves that every packet of p passes the chains a forwarded
// packet traverses unchanged: returns "" when it does, else why not (the
// first rule or policy that may drop, change or mark one). It is
// conservative: a rule it does not fully understand may match, and a
// target it does not know may change the packet.
func (rs *Ruleset) Check(p Packets) string {
	all := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if p.Dst.Is6() {
		all = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	for _, fc := range forwardChains {
		t := rs.Tables[fc.table]
		if t == nil || t.Chains[fc.chain] == nil {
			continue
		}
		e := evaluator{rs: rs, t: t, p: p, active: map[string]bool{}}
		if _, why := e.chain(fc.chain, srcSet{all}); why != "" {
			return why
		}
	}
	return ""
}

type evaluator struct {
	rs     *Ruleset
	t      *Table
	p      Packets
	active map[string]bool // the chains being evaluated (a jump loop guard)
}

// targets that neither end nor change a packet's path.
var passTargets = map[string]bool{"": true, "LOG": true, "NFLOG": true}

// chain evaluates chain name for the packets of e.p from sources srcs:
// returns the sources whose packets may come back to the caller (fall
// off its end or RETURN), and why not proven ("" when every path
// accepts or returns unchanged). A built-in chain's packets that come
// back meet its policy.
func (e *evaluator) chain(name string, srcs srcSet) (back srcSet, why string) {
	c := e.t.Chains[name]
	if c == nil {
		return nil, fmt.Sprintf("%s %s: jump to undeclared chain %s", e.rs.Tool, e.t.Name, name)
	}
	if e.active[name] {
		return nil, fmt.Sprintf("%s %s %s: jumps loop back to it", e.rs.Tool, e.t.Name, name)
	}
	e.active[name] = true
	defer delete(e.active, name)
	back, why = e.rules(c, srcs)
	if c.Policy == "-" || why != "" {
		return back, why
	}
	if len(back) > 0 && c.Policy != "ACCEPT" {
		why = fmt.Sprintf("%s %s %s policy %s may %s packets to %s", e.rs.Tool, e.t.Name, name, c.Policy, verb(c.Policy), e.p.Dst)
	}
	return nil, why
}

// rules walks c's rules with the sources cur that may reach each.
func (e *evaluator) rules(c *Chain, cur srcSet) (back srcSet, why string) {
	for i := range c.Rules {
		if len(cur) == 0 {
			return back, "" // every packet ended before
		}
		r := &c.Rules[i]
		m := r.match(e.p)
		if m == cannot {
			continue
		}
		in, out := cur, srcSet(nil)
		if r.Src.Set {
			in, out = cur.split(r.Src.Prefix, r.Src.Not)
		}
		if len(in) == 0 {
			continue
		}
		// When the rule surely matches the packets from in, only
		// those from out go on to the next rule.
		// (A set split past maxSrcs is kept whole: a superset of
		// the sources that go on is still a sound answer.)
		next := cur
		if m == surely && len(out) <= maxSrcs {
			next = out
		}
		switch {
		case passTargets[r.Target]:
		case r.Target == "ACCEPT":
			cur = next
		case r.Target == "RETURN":
			back = append(back, in...)
			cur = next
		case e.t.Chains[r.Target] != nil:
			b, why := e.chain(r.Target, in)
			if why != "" {
				return nil, why
			}
			if r.Goto {
				// Returning from a goto's chain returns from this one.
				back = append(back, b...)
				cur = next
			} else if m == surely {
				cur = slices.Concat(next, b)
			}
		default:
			return nil, fmt.Sprintf("%s %s %s rule %d (%s) may %s packets to %s", e.rs.Tool, e.t.Name, c.Name, i+1, r.Text, verb(r.Target), e.p.Dst)
		}
	}
	return append(back, cur...), ""
}

func verb(target string) string {
	switch target {
	case "DROP":
		return "drop"
	case "REJECT":
		return "reject"
	case "MARK", "CONNMARK":
		return "mark"
	case "DNAT", "SNAT", "MASQUERADE", "REDIRECT", "NETMAP":
		return "rewrite the addresses of"
	case "NFQUEUE", "QUEUE":
		return "queue to user space"
	}
	return "apply target " + target + " to"
}
