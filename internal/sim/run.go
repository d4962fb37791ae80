// Package sim is the discrete-event model of the Linux NAPI/softirq receive
// path: CPUs with hard IRQ, NET_RX softirq (net_rx_action with budget, time
// limit, weight, restart and ksoftirqd deferral) and application threads;
// NAPI stages (NIC rings, gro_cells, per-CPU backlog); flows; and the
// policies of the seeds (vanilla, PRISM, seed-002 ring scheduling, RPS,
// FALCON, ANP). The event core lives in internal/sim/event and knows
// nothing about packets.
package sim

// Run simulates a scenario and returns its result.
func Run(sc *Scenario) *Result {
	m := NewModel(sc)
	return m.Run()
}

// Run executes the model until duration_ms.
func (m *Model) Run() *Result {
	for _, f := range m.flows {
		m.startFlow(f)
	}
	m.steer.start()
	m.startStalls()
	m.sim.RunUntil(m.warm)
	for _, c := range m.cpus {
		c.acct0 = c.acct
		for l := range c.slots {
			if c.slots[l].running {
				// time before the window is not counted
				c.acct0[c.slots[l].kind] += m.warm - c.slots[l].start
			}
		}
		c.netRx0, c.irq0, c.wakes0 = c.netRx, c.irqs, c.wakes
		c.ksoftirqd, c.squeezed = 0, 0
	}
	m.sim.RunUntil(m.end)
	return m.result()
}
