package sim

import "math"

// policy is the poll-list discipline of net_rx_action and the NAPI poll
// functions: which device runs next, which of its queues, for how long,
// and where a device goes when it is (re)scheduled.
type policy interface {
	perLane() bool
	beginRx(c *cpu)
	pick(c *cpu) *napi
	pollQueue(c *cpu, n *napi) (lane, limit int)
	yield(c *cpu, n *napi) bool
	schedule(c *cpu, n *napi, lane int)
	bump(c *cpu, n *napi)
	repoll(c *cpu, n *napi)
	endRx(c *cpu)
	pending(c *cpu) bool
	inline(p *packet) bool
	snapshot(c *cpu) []string
}

func newPolicy(sc *Scenario) policy {
	switch sc.Policy {
	case "prism-batch":
		return &prism{}
	case "prism-sync":
		return &prism{sync: true}
	}
	return &vanilla{kernelRepoll: sc.Repoll == "kernel", rings: sc.NIC.Rings}
}

// vanilla is Fig. 2 of PRISM: a global poll list where devices are added,
// a local list that net_rx_action works through, FIFO packet queues,
// repolled devices re-queued at the tail. The NIC class rings of seed 002
// (rr, wfq, prio) are served through the same lists; prio also picks a
// real-time ring first and revokes a best-effort ring at packet
// boundaries.
type vanilla struct {
	kernelRepoll bool
	rings        string
}

func (v *vanilla) perLane() bool { return false }

func (v *vanilla) beginRx(c *cpu) {
	c.local = append(c.local, c.global...)
	c.global = c.global[:0]
}

func removeAt(l []*napi, i int) []*napi {
	copy(l[i:], l[i+1:])
	l[len(l)-1] = nil
	return l[:len(l)-1]
}

func (v *vanilla) pick(c *cpu) *napi {
	if v.rings == "prio" {
		for i, n := range c.local {
			if n.ringLane == laneHigh {
				c.local = removeAt(c.local, i)
				return n
			}
		}
		for i, n := range c.global {
			if n.ringLane == laneHigh {
				c.global = removeAt(c.global, i)
				return n
			}
		}
	}
	if c.m.threadedNIC {
		if n := pickSoftirqFirst(c); n != nil {
			return n
		}
	}
	if len(c.local) == 0 {
		return nil
	}
	n := c.local[0]
	c.local = removeAt(c.local, 0)
	return n
}

// pickSoftirqFirst is Kernel.ThreadedNIC: a ring's kthread polls it again
// only after the softirq its last poll raised has run every other NAPI of
// the CPU dry, so any NAPI but a ring's goes first, including one
// scheduled during this softirq (the kernel's net_rx_action takes those
// before it returns); nil when only rings have work.
func pickSoftirqFirst(c *cpu) *napi {
	for _, l := range []*[]*napi{&c.local, &c.global} {
		for i, n := range *l {
			if n.kind != kindNIC {
				*l = removeAt(*l, i)
				return n
			}
		}
	}
	return nil
}

func (v *vanilla) pollQueue(c *cpu, n *napi) (int, int) {
	if n.ringLane == laneHigh && v.rings == "prio" {
		return 0, math.MaxInt32
	}
	return 0, n.weight
}

// yield is seed 002's resource revocation: a best-effort ring gives the
// CPU up at a packet boundary as soon as a real-time ring has work.
func (v *vanilla) yield(c *cpu, n *napi) bool {
	if v.rings != "prio" || n.ringLane != laneLow {
		return false
	}
	for _, r := range c.rtRings {
		if r.sched && r.q[0].n > 0 {
			return true
		}
	}
	return false
}

func (v *vanilla) schedule(c *cpu, n *napi, lane int) { c.global = append(c.global, n) }
func (v *vanilla) bump(c *cpu, n *napi)               {}

func (v *vanilla) repoll(c *cpu, n *napi) {
	if v.kernelRepoll {
		c.repollL = append(c.repollL, n)
		return
	}
	c.global = append(c.global, n)
}

func (v *vanilla) endRx(c *cpu) {
	// move POLL_LIST to the tail of poll_list; move poll_list to POLL_LIST
	// (kernel: list_splice_tail_init(&sd->poll_list, &list);
	// list_splice_tail_init(&repoll, &list); list_splice(&list, &sd->poll_list))
	l := append(c.local, c.global...)
	l = append(l, c.repollL...)
	c.global = l
	c.local = make([]*napi, 0, 8)
	c.repollL = c.repollL[:0]
}

func (v *vanilla) pending(c *cpu) bool {
	return len(c.global) > 0 || len(c.local) > 0 || len(c.repollL) > 0
}

func (v *vanilla) inline(p *packet) bool { return false }

func (v *vanilla) snapshot(c *cpu) []string { return listNames(c.local, c.global, c.repollL) }

// prism is Fig. 7 of PRISM: a single poll list, high-priority work inserted
// at the head, a high and a low queue per device, batch-level preemption.
// In sync mode high-priority packets run every later stage inline.
type prism struct{ sync bool }

func (p *prism) perLane() bool  { return true }
func (p *prism) beginRx(c *cpu) {}

func (p *prism) pick(c *cpu) *napi {
	if len(c.global) == 0 {
		return nil
	}
	n := c.global[0]
	c.global = removeAt(c.global, 0)
	return n
}

func (p *prism) pollQueue(c *cpu, n *napi) (int, int) {
	if n.perLane && n.has(laneHigh) {
		return laneHigh, n.weight
	}
	return laneLow, n.weight
}

func (p *prism) yield(c *cpu, n *napi) bool { return false }

func (p *prism) schedule(c *cpu, n *napi, lane int) {
	if lane == laneHigh {
		c.global = append(c.global, nil)
		copy(c.global[1:], c.global)
		c.global[0] = n
		return
	}
	c.global = append(c.global, n)
}

// bump moves an already scheduled device to the head of the list when it
// receives a high-priority packet ("added (or moved) to the head").
func (p *prism) bump(c *cpu, n *napi) {
	for i, x := range c.global {
		if x == n {
			if i > 0 {
				copy(c.global[1:i+1], c.global[:i])
				c.global[0] = n
			}
			return
		}
	}
}

func (p *prism) repoll(c *cpu, n *napi) {
	if n.perLane && n.has(laneHigh) {
		p.schedule(c, n, laneHigh)
		return
	}
	c.global = append(c.global, n)
}

func (p *prism) endRx(c *cpu)             {}
func (p *prism) pending(c *cpu) bool      { return len(c.global) > 0 }
func (p *prism) inline(pk *packet) bool   { return p.sync && pk.lane == laneHigh }
func (p *prism) snapshot(c *cpu) []string { return listNames(c.global) }
