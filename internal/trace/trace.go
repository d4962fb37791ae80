package trace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
)

// Backlog is the device name the reports give the per-CPU backlog NAPI
// (process_backlog), which belongs to no device. Put it in Options.Devices
// to keep it when filtering by device.
const Backlog = "backlog"

// Options configures a tracer. The zero value traces every device in every
// network namespace.
type Options struct {
	// Devices keeps only NAPI polls and packet events of these device
	// names (Backlog for the per-CPU backlog). Empty: all devices.
	Devices []string
	// Netns keeps only devices in these network namespaces, by inode
	// (see NetnsInode). The backlog always passes. Empty: all.
	Netns []uint32
	// DeliveryDevice names the device whose net:netif_receive_skb events
	// count as delivered packets (for a container, its interface, e.g.
	// "ctB"; for the host path, the wire, e.g. "wireB"). Report.Packets
	// and SoftirqsPerPacket come from it. Empty: unknown until
	// Report.SetPackets.
	DeliveryDevice string
	// NoPolls skips the per-poll sequence (counters are still kept).
	NoPolls bool
	// NoDelays skips per-skb stage-delay tracking.
	NoDelays bool
	// MaxPolls bounds the poll events kept in the report (default
	// 200000); later ones are counted in Lost.PollsTruncated.
	MaxPolls int
	// RingBytes is the ring buffer size, a power of two (default 4 MiB).
	RingBytes int
	// MaxInflight bounds the LRU map of in-flight skbs (default 65536).
	MaxInflight int
}

func (o Options) withDefaults() Options {
	if o.MaxPolls <= 0 {
		o.MaxPolls = 200000
	}
	if o.RingBytes <= 0 {
		o.RingBytes = 4 << 20
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = 65536
	}
	return o
}

// Validate checks the options; errors name the option.
func (o Options) Validate() error {
	for _, d := range o.Devices {
		if d == "" || len(d) >= ifNameSize {
			return fmt.Errorf("device %q: want a name of 1-15 characters", d)
		}
	}
	if o.RingBytes > 0 && (o.RingBytes&(o.RingBytes-1) != 0 || o.RingBytes < os.Getpagesize()) {
		return fmt.Errorf("ring bytes %d: want a power of two of at least the page size", o.RingBytes)
	}
	if len(o.DeliveryDevice) >= ifNameSize {
		return fmt.Errorf("delivery device %q: want at most 15 characters", o.DeliveryDevice)
	}
	return nil
}

// NetnsInode returns the inode of a network namespace file, e.g.
// /run/netns/NAME or /proc/PID/ns/net, as the tracer sees it.
func NetnsInode(path string) (uint32, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat netns %s: %w", path, err)
	}
	return uint32(st.Ino), nil
}

// ErrUnavailable wraps failures that mean BPF tracing cannot run here at
// all (no privileges, no BTF, no tp_btf support).
var ErrUnavailable = errors.New("bpf tracing unavailable")

// Tracer is a running tracer. Stop it to get the report.
type Tracer struct {
	opts  Options
	objs  napiTraceObjects
	links []link.Link
	rd    *ringbuf.Reader
	start time.Time
	cpus  int

	detachOnce sync.Once
	stopOnce   sync.Once
	done       chan struct{} // reader finished
	ctxDone    chan struct{} // closed by Stop to end the ctx watcher

	mu        sync.Mutex
	polls     []pollEvent
	truncated uint64
	readErr   error
}

// Start loads and attaches the tracer. Cancelling ctx detaches the probes
// early; Stop must still be called to get the report and free resources.
func Start(ctx context.Context, o Options) (*Tracer, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("start tracer: %w", err)
	}
	o = o.withDefaults()
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit: %w: %w", ErrUnavailable, err)
	}
	spec, err := loadNapiTrace()
	if err != nil {
		return nil, fmt.Errorf("load tracer spec: %w", err)
	}
	if err := configure(spec, o); err != nil {
		return nil, fmt.Errorf("configure tracer: %w", err)
	}
	t := &Tracer{opts: o, done: make(chan struct{}), ctxDone: make(chan struct{})}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load tracer programs: %w\n%+v", err, ve)
		}
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("load tracer programs: %w: %w", ErrUnavailable, err)
		}
		return nil, fmt.Errorf("load tracer programs: %w", err)
	}
	if err := t.fillFilters(); err != nil {
		t.objs.Close()
		return nil, err
	}
	if !o.NoPolls {
		t.rd, err = ringbuf.NewReader(t.objs.Events)
		if err != nil {
			t.objs.Close()
			return nil, fmt.Errorf("open ring buffer: %w", err)
		}
	}
	if err := t.attach(); err != nil {
		t.close()
		return nil, err
	}
	t.start = time.Now()
	t.cpus, err = ebpf.PossibleCPU()
	if err != nil {
		t.close()
		return nil, fmt.Errorf("count possible cpus: %w", err)
	}
	if t.rd != nil {
		go t.read()
	} else {
		close(t.done)
	}
	go func() {
		select {
		case <-ctx.Done():
			t.detach()
		case <-t.ctxDone:
		}
	}()
	return t, nil
}

func configure(spec *ebpf.CollectionSpec, o Options) error {
	set := func(name string, v bool) error {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("find variable %s: not in object", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		return nil
	}
	for name, v := range map[string]bool{
		"filter_devices": len(o.Devices) > 0,
		"filter_netns":   len(o.Netns) > 0,
		"emit_polls":     !o.NoPolls,
		"track_delays":   !o.NoDelays,
	} {
		if err := set(name, v); err != nil {
			return err
		}
	}
	spec.Maps["events"].MaxEntries = uint32(o.RingBytes)
	spec.Maps["inflight"].MaxEntries = uint32(o.MaxInflight)
	return nil
}

func (t *Tracer) fillFilters() error {
	one := uint8(1)
	for _, d := range t.opts.Devices {
		name := d
		if d == Backlog {
			name = ""
		}
		k := devNameKey(name)
		if err := t.objs.AllowedDevs.Put(&k, &one); err != nil {
			return fmt.Errorf("add device %s to filter: %w", d, err)
		}
	}
	if len(t.opts.Netns) > 0 {
		for _, ino := range append([]uint32{0}, t.opts.Netns...) {
			if err := t.objs.AllowedNetns.Put(&ino, &one); err != nil {
				return fmt.Errorf("add netns %d to filter: %w", ino, err)
			}
		}
	}
	return nil
}

func (t *Tracer) attach() error {
	p := t.objs.napiTracePrograms
	progs := []*ebpf.Program{p.TraceSoftirqEntry, p.TraceSoftirqExit, p.TraceNapiPoll}
	if !t.opts.NoDelays || t.opts.DeliveryDevice != "" {
		progs = append(progs, p.TraceNetDevStartXmit, p.TraceNapiGroReceiveEntry, p.TraceNetifRx, p.TraceNetifReceiveSkb)
	}
	if !t.opts.NoDelays {
		progs = append(progs, p.TraceSkbCopyDatagramIovec, p.TraceConsumeSkb, p.TraceKfreeSkb)
	}
	for _, prog := range progs {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			info, _ := prog.Info()
			name := ""
			if info != nil {
				name = info.Name
			}
			if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, os.ErrPermission) {
				err = fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			return fmt.Errorf("attach %s: %w", name, err)
		}
		t.links = append(t.links, l)
	}
	return nil
}

// read drains the ring buffer until it is flushed or closed.
func (t *Tracer) read() {
	defer close(t.done)
	var rec ringbuf.Record
	for {
		err := t.rd.ReadInto(&rec)
		if err != nil {
			if !errors.Is(err, ringbuf.ErrFlushed) && !errors.Is(err, os.ErrClosed) {
				t.mu.Lock()
				t.readErr = fmt.Errorf("read ring buffer: %w", err)
				t.mu.Unlock()
			}
			return
		}
		var e pollEvent
		if err := decode(rec.RawSample, &e); err != nil {
			t.mu.Lock()
			t.readErr = err
			t.mu.Unlock()
			continue
		}
		t.mu.Lock()
		if len(t.polls) < t.opts.MaxPolls {
			t.polls = append(t.polls, e)
		} else {
			t.truncated++
		}
		t.mu.Unlock()
	}
}

// detach removes the probes; counters keep what they saw.
func (t *Tracer) detach() {
	t.detachOnce.Do(func() {
		for _, l := range t.links {
			l.Close()
		}
	})
}

func (t *Tracer) close() {
	t.detach()
	if t.rd != nil {
		t.rd.Close()
	}
	t.objs.Close()
}

// Stop detaches the probes, drains the ring buffer, reads the counters and
// returns the report. It frees the tracer; a second Stop returns an error.
func (t *Tracer) Stop() (*Report, error) {
	var rep *Report
	err := errors.New("stop tracer: already stopped")
	t.stopOnce.Do(func() {
		close(t.ctxDone)
		t.detach()
		end := time.Now()
		if t.rd != nil {
			if ferr := t.rd.Flush(); ferr != nil {
				t.rd.Close()
			}
		}
		<-t.done
		rep, err = t.report(end)
		t.close()
	})
	return rep, err
}
