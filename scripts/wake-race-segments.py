#!/usr/bin/env python3
# wake-race-segments: the analysis half of scripts/wake-race (see its header
# for the segments and the JSON it writes), on its own so that a test can
# run it on a committed trace excerpt (internal/sim/twin, TestWakeRaceSegments).
#
#   scripts/wake-race-segments.py TRACE.txt.gz BENCH.json LOAD OUT.json
import gzip, json, re, statistics, sys

EV = re.compile(r'^\s*(\S+)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): ([^ :]+):? ?(.*)$')
SKB = re.compile(r'skbaddr=(\S+)')
PID = re.compile(r' pid=(\d+)')
FLAGS = re.compile(r'^.*?\]\s+(\S+)\s+[\d.]+: ')  # irqs-off, need-resched, hardirq/softirq, ...
NEXT = re.compile(r'next_pid=(\d+)')
NPRIO = re.compile(r'next_pid=(\d+) next_prio=(\d+)')
sent = {}      # application-CPU thread -> time its request left ctA
req = {}       # request skb -> its times
echo = {}      # echo thread -> request waiting for it to run and reply
waiting = None  # request whose echo wake-up the receive CPU is making
ipi_wake = None
reply = {}     # reply skb -> request
rx_wait = None  # the request whose reply ctA's socket just received
prober = {}    # prober thread its reply's socket woke -> that request
done = []
cur0 = 'idle'  # what the application CPU runs: idle, nice-20 (prio 100), nice0 (120) or other
pid0 = 0       # the thread it runs
sender = {}    # prober thread -> the request it sent last, until it sleeps
PREV = re.compile(r'prev_pid=(\d+) ')
ipi_at = {}    # CPU -> when it sent a reschedule IPI whose wake-up has not returned
ipi_send = []  # how long the waker waited for its IPI (send -> its sched_wakeup)
for line in gzip.open(sys.argv[1], 'rt'):
    m = EV.match(line)
    if not m:
        continue
    pid, cpu, ts, name, rest = int(m.group(2)), int(m.group(3)), float(m.group(4)) * 1e6, m.group(5), m.group(6)
    if name == 'ipi_send_cpu' and 'callback=0x0' in rest:
        ipi_at[cpu] = ts
    elif name == 'sched_wakeup' and cpu in ipi_at:
        ipi_send.append(ts - ipi_at.pop(cpu))
    skb = SKB.search(rest)
    skb = skb and skb.group(1)
    if name == 'net_dev_xmit' and cpu == 0 and 'dev=ctA ' in rest:
        sent[pid] = ts
    elif name == 'net_dev_xmit' and cpu == 0 and 'dev=wireA ' in rest and pid in sent:
        req[skb] = sender[pid] = {'ctA': sent.pop(pid), 'wireA': ts, 'by': pid}
    elif name == 'netif_receive_skb' and 'dev=ctB ' in rest and skb in req:
        waiting = req.pop(skb)
        waiting['ctB'] = ts
    elif name == 'sched_waking' and cpu == 1 and 'target_cpu=000' in rest and waiting:
        r, waiting = waiting, None
        r['wake'], r['ipi'], r['found'] = ts, False, cur0
        r['found_sender'] = pid0 == r['by']
        echo[int(PID.search(rest).group(1))] = r
        ipi_wake = r
    elif name == 'ipi_send_cpu' and cpu == 1 and 'cpu=0 ' in rest and 'wakeup_preempt' in rest and ipi_wake:
        ipi_wake['ipi'] = True
    elif name == 'sched_wakeup' and cpu == 1:
        ipi_wake = None
    elif name == 'sched_switch' and cpu == 0:
        nxt, prio = (int(g) for g in NPRIO.search(rest).groups())
        cur0 = 'idle' if nxt == 0 else {100: 'nice-20', 120: 'nice0'}.get(prio, 'other')
        pid0 = nxt
        prev = int(PREV.search(rest).group(1))
        if prev in sender:
            # the prober leaves the CPU after its send: the end of its send path
            sender.pop(prev)['psleep'] = ts
        if nxt in echo and 'runs' not in echo[nxt]:
            echo[nxt]['runs'] = ts
        if nxt in prober:
            prober.pop(nxt)['probed'] = ts
    elif name == 'net_dev_xmit' and 'dev=ctB ' in rest and pid in echo and 'runs' in echo[pid]:
        r = echo.pop(pid)
        r['sent'] = ts
        reply[skb] = r
    elif name == 'netif_receive_skb' and 'dev=ctA ' in rest and skb in reply:
        r = reply.pop(skb)
        r['ctA_rx'] = ts
        done.append(r)
        rx_wait = r
    elif name == 'sched_waking' and cpu == 0 and rx_wait and 'target_cpu=000' in rest and FLAGS.match(line).group(1)[2] == 's':
        # the reply's socket wakes a prober thread in the softirq that
        # received it (within 5 us). Not any waking on CPU 0: the
        # generator's sends wake the wire's kthread (target CPU 1), its
        # timers wake it in hardirq context; taken for the prober's, one
        # stalled every later request
        if ts - rx_wait['ctA_rx'] <= 5:
            prober[int(PID.search(rest).group(1))] = rx_wait
        rx_wait = None

def seg(rs, a, b, fmt=None):
    # median of b - a over the requests that have both (probed: only
    # some have it); None, or '-' with fmt, when none has
    v = [r[b] - r[a] for r in rs if a in r and b in r]
    if fmt is None:
        return statistics.median(v) if v else None
    return fmt % statistics.median(v) if v else '-'
SEGS = [('A>wire', 'ctA', 'wireA'), ('rxCPU', 'wireA', 'ctB'), ('>wake', 'ctB', 'wake'), ('>echo', 'wake', 'runs'),
        ('>send', 'runs', 'sent'), ('>ctA', 'sent', 'ctA_rx'), ('>probe', 'ctA_rx', 'probed'), ('total', 'ctA', 'probed')]
bench = json.load(open(sys.argv[2]))['cases'][-1]
load = sys.argv[3]
print('%s: round trip p50 %.1f p99 %.1f us (bench, untraced part of the run included); %d requests traced, %.0f%% with an IPI' % (
    load, bench['p50_us']['median'], bench['p99_us']['median'], len(done), 100 * sum(r['ipi'] for r in done) / max(1, len(done))))
print('  %-10s %5s ' % ('echo wake', 'n') + ' '.join('%7s' % s[0] for s in SEGS))
for label, sel in (('all', lambda r: True), ('IPI', lambda r: r['ipi']), ('no IPI', lambda r: not r['ipi'])):
    rs = [r for r in done if sel(r)]
    if rs:
        print('  %-10s %5d ' % (label, len(rs)) + ' '.join('%7s' % seg(rs, a, b, '%.1f') for _, a, b in SEGS))
KEYS = ['a_wire', 'rx_cpu', 'wake', 'echo_runs', 'echo_sends', 'reply', 'probe_runs', 'total']
def medians(rs):
    return {k: v for k, (_, a, b) in zip(KEYS, SEGS) if (v := seg(rs, a, b)) is not None}
ipi = [r for r in done if r['ipi']]
found = {k: sum(r['found'] == k for r in done) / max(1, len(done)) for k in ('idle', 'nice-20', 'nice0', 'other')}
print('  at the echo wake-up the application CPU ran: ' + ', '.join('%s %.0f%%' % (k, 100 * v) for k, v in found.items()))
if ipi_send:
    print('  a reschedule IPI keeps its sender %.0f us (median of %d)' % (statistics.median(ipi_send), len(ipi_send)))
# the race between the prober's send path (it runs on after its request
# left ctA) and the request's way to the echo server's wake-up
race = [r for r in done if 'psleep' in r]
margins = sorted(r['psleep'] - r['wake'] for r in race)
found_sender = [r for r in done if r.get('found_sender')]
def q(v, p):
    return v[min(len(v) - 1, int(p * len(v)))] if v else None
# the window of margins in which the echo server's wake-up is slow (it
# runs >= 8 us after it: the IPI that the wake-up needs reaches a CPU that
# is halting): margins bucketed to whole us (buckets of >= 10 requests),
# the edges where the slow share crosses 50% (linear between buckets)
SLOW = 8.0
buckets = {}
for r in race:
    b = buckets.setdefault(round(r['psleep'] - r['wake']), [0, 0])
    b[0] += 1
    b[1] += (r['runs'] - r['wake']) >= SLOW
share = {m: b[1] / b[0] for m, b in buckets.items() if b[0] >= 10}
window = None
if share:
    # the slow bucket nearest 0: beyond a few us the prober's own run,
    # not the IPI, keeps the echo server waiting
    near = [m for m in share if share[m] >= 0.5]
    peak = min(near, key=abs) if near else None
    if peak is not None:
        def edge(step):
            m = peak
            while m + step in share and share[m + step] >= 0.5:
                m += step
            nxt = m + step
            if nxt not in share:
                return m + step / 2
            return m + step * (share[m] - 0.5) / (share[m] - share[nxt])
        window = [round(edge(-1), 2), round(edge(1), 2)]
slow = [r['runs'] - r['wake'] for r in race if window and window[0] < r['psleep'] - r['wake'] < window[1] and r['runs'] - r['wake'] >= SLOW]
if window:
    print('  the echo server waits >= %.0f us when the prober leaves the CPU between %.1f and %.1f us after its wake-up (then %.0f us, median)' % (
        SLOW, window[0], window[1], statistics.median(slow) if slow else float('nan')))
if race:
    print('  the prober ran on after its send %.0f us (median); the echo wake-up found it still running in %.0f%% (it then ran %.0f us after the wake-up, median)' % (
        statistics.median(r['psleep'] - r['ctA'] for r in race), 100 * len(found_sender) / max(1, len(done)),
        statistics.median(r['runs'] - r['wake'] for r in found_sender) if found_sender else float('nan')))
json.dump({'load': load, 'requests': len(done), 'ipi_share': len(ipi) / max(1, len(done)), 'segments_us': medians(done),
           'ipi_requests': len(ipi), 'ipi_segments_us': medians(ipi), 'no_ipi_segments_us': medians([r for r in done if not r['ipi']]),
           'found_share': found, 'ipi_send_us': statistics.median(ipi_send) if ipi_send else None, 'ipi_sends': len(ipi_send),
           'probe_after_us': statistics.median(r['psleep'] - r['ctA'] for r in race) if race else None,
           'found_sender_share': len(found_sender) / max(1, len(done)),
           'found_sender_echo_runs_us': statistics.median(r['runs'] - r['wake'] for r in found_sender) if found_sender else None,
           'race_margin_us': [q(margins, i / 20) for i in range(21)] if margins else None,
           'found_idle_echo_runs_us': statistics.median(r['runs'] - r['wake'] for r in done if r['found'] == 'idle') if any(r['found'] == 'idle' for r in done) else None,
           'slow_window_us': window, 'slow_echo_runs_us': statistics.median(slow) if slow else None},
          open(sys.argv[4], 'w'))
