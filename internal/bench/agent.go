package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rxlane/rxlane/internal/testbed"
	"golang.org/x/sys/unix"
)

// Load runs in agents: separate processes of rxlane itself (the hidden
// `rxlane bench agent ROLE` verb), started inside a testbed node and pinned
// to the layout's CPUs, so the kernel schedules the prober, the echo server,
// the sink and the generator as it would separate applications. An agent
// prints "ready" once its socket is open, then one JSON result line when it
// finishes (at the end of its duration or on SIGTERM).

// AgentArgs are the options of every agent role.
type AgentArgs struct {
	Role     string        // echo, sink, probe, inject, tcpsink, tcpflood
	Proto    string        // udp or tcp (echo, probe)
	Addr     string        // listen (echo, sink) or destination (probe) host:port
	Size     int           // request size (echo, probe) or UDP payload (inject)
	Rate     float64       // requests/s (probe) or packets/s (inject)
	Duration time.Duration // probe, inject
	Warmup   time.Duration // probe; sink: not counted after the first packet
	Dev      string        // inject: device to send on
	Path     string        // inject: overlay or host
	VNI      int           // inject
	Port     int           // inject: VXLAN port
	DstPort  int           // inject: sink port
	Flows    int           // inject: number of background flows
	Count    int64         // sink, inject: finish after this many packets (0: no limit)
	Sched    string        // scheduling class: inject, tcpflood BgSchedNormal/BgSchedIdle; echo, probe BgSchedNormal/AppSchedNice
	// Frame (inject), when set, is the first flow's frame as FrameSpec
	// JSON, for a node that is not the testbed; flows differ in SrcPort.
	Frame    string
	ViaQdisc bool // inject: through the qdisc layer (tc egress), not around it
}

// Argv renders the args as the agent command line.
func (a AgentArgs) Argv(self string) []string {
	return []string{self, "bench", "agent", a.Role,
		"-proto", a.Proto, "-addr", a.Addr, "-size", fmt.Sprint(a.Size),
		"-rate", fmt.Sprint(a.Rate), "-duration", a.Duration.String(), "-warmup", a.Warmup.String(),
		"-dev", a.Dev, "-path", a.Path, "-vni", fmt.Sprint(a.VNI), "-port", fmt.Sprint(a.Port),
		"-dst-port", fmt.Sprint(a.DstPort), "-flows", fmt.Sprint(a.Flows), "-count", fmt.Sprint(a.Count), "-sched", a.Sched, fmt.Sprintf("-via-qdisc=%v", a.ViaQdisc),
		"-frame", a.Frame}
}

// AgentMain parses an agent command line (ROLE then flags, as Argv
// renders them after "bench agent") and runs the agent. It is shared by the
// CLI's hidden verb and by test binaries, which start themselves as agents.
func AgentMain(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 {
		return errors.New("agent: want ROLE [flags]")
	}
	a := AgentArgs{Role: args[0]}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&a.Proto, "proto", "udp", "")
	fs.StringVar(&a.Addr, "addr", "", "")
	fs.IntVar(&a.Size, "size", 64, "")
	fs.Float64Var(&a.Rate, "rate", 1000, "")
	fs.DurationVar(&a.Duration, "duration", 0, "")
	fs.DurationVar(&a.Warmup, "warmup", 0, "")
	fs.StringVar(&a.Dev, "dev", "", "")
	fs.StringVar(&a.Path, "path", "overlay", "")
	fs.IntVar(&a.VNI, "vni", 42, "")
	fs.IntVar(&a.Port, "port", 4789, "")
	fs.IntVar(&a.DstPort, "dst-port", 9000, "")
	fs.IntVar(&a.Flows, "flows", 1, "")
	fs.Int64Var(&a.Count, "count", 0, "")
	fs.StringVar(&a.Sched, "sched", BgSchedNormal, "")
	fs.BoolVar(&a.ViaQdisc, "via-qdisc", false, "")
	fs.StringVar(&a.Frame, "frame", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("agent %s: %w", a.Role, err)
	}
	return RunAgent(ctx, a, out)
}

// RunAgent is the body of an agent process.
func RunAgent(ctx context.Context, a AgentArgs, out io.Writer) error {
	ready := func() { fmt.Fprintln(out, "ready") }
	emit := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	}
	switch a.Role {
	case "echo":
		if err := setSched(a.Sched); err != nil {
			return err
		}
		if a.Proto == "tcp" {
			ln, err := net.Listen("tcp4", a.Addr)
			if err != nil {
				return fmt.Errorf("echo listen %s: %w", a.Addr, err)
			}
			ready()
			if err := ServeEchoTCP(ctx, ln, a.Size); err != nil {
				return err
			}
			return emit(struct{}{})
		}
		fd, err := udpSocket(a.Addr, "")
		if err != nil {
			return fmt.Errorf("echo: %w", err)
		}
		defer unix.Close(fd)
		ready()
		if err := serveEchoUDP(ctx, fd); err != nil {
			return err
		}
		return emit(struct{}{})
	case "sink":
		fd, err := udpSocket(a.Addr, "")
		if err != nil {
			return fmt.Errorf("sink: %w", err)
		}
		defer unix.Close(fd)
		ready()
		return emit(RunSink(ctx, fd, a.Count, a.Warmup))
	case "probe":
		if err := setSched(a.Sched); err != nil {
			return err
		}
		cfg := ProbeConfig{Proto: a.Proto, Dst: a.Addr, Rate: a.Rate, Duration: a.Duration, Size: a.Size, Warmup: a.Warmup, Grace: 500 * time.Millisecond}
		var res ProbeResult
		if a.Proto == "tcp" {
			conn, err := net.Dial("tcp4", a.Addr)
			if err != nil {
				return fmt.Errorf("probe connect %s: %w", a.Addr, err)
			}
			ready()
			res, err = RunProbeTCP(ctx, cfg, conn)
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
		} else {
			fd, err := udpSocket("", a.Addr)
			if err != nil {
				return fmt.Errorf("probe: %w", err)
			}
			defer unix.Close(fd)
			ready()
			res, err = RunProbeUDP(ctx, cfg, fd)
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
		}
		return emit(res)
	case "tcpsink":
		ln, err := net.Listen("tcp4", a.Addr)
		if err != nil {
			return fmt.Errorf("tcp sink listen %s: %w", a.Addr, err)
		}
		ready()
		return emit(RunTCPSink(ctx, ln, a.Size))
	case "tcpflood":
		if err := setSched(a.Sched); err != nil {
			return err
		}
		conn, err := net.Dial("tcp4", a.Addr)
		if err != nil {
			return fmt.Errorf("tcp flood connect %s: %w", a.Addr, err)
		}
		return emit(RunTCPFlood(ctx, conn, a.Rate, a.Size, a.Duration, ready))
	case "inject":
		if err := setSched(a.Sched); err != nil {
			return err
		}
		frames := BackgroundFrames(a.Path, a.VNI, a.Port, a.DstPort, a.Size, a.Flows)
		if a.Frame != "" {
			var spec FrameSpec
			if err := json.Unmarshal([]byte(a.Frame), &spec); err != nil {
				return fmt.Errorf("inject: frame: %w", err)
			}
			frames = spec.Flows(a.Flows)
		}
		in, err := NewInjector(a.Dev, frames, 16, a.ViaQdisc)
		if err != nil {
			return err
		}
		defer in.Close()
		return emit(in.Run(ctx, a.Rate, a.Duration, a.Count, ready))
	}
	return fmt.Errorf("unknown agent role %q", a.Role)
}

// BackgroundFrames builds one frame per background flow from hostA to the
// sink on hostB (path host) or in ctrB (path overlay). Flows differ in
// their UDP source port, and so in their hash.
func BackgroundFrames(path string, vni, vxlanPort, dstPort, payload, flows int) [][]byte {
	if flows < 1 {
		flows = 1
	}
	var out [][]byte
	for i := 0; i < flows; i++ {
		s := FrameSpec{
			SrcMAC: testbed.MACWireA, DstMAC: testbed.MACWireB,
			SrcIP: testbed.UnderlayA, DstIP: testbed.UnderlayB,
			SrcPort: uint16(20000 + i), DstPort: uint16(dstPort), Payload: payload,
		}
		if path == "overlay" {
			s.VNI, s.VXLANPort = uint32(vni), uint16(vxlanPort)
			s.InnerSrcMAC, s.InnerDstMAC = testbed.MACCtA, testbed.MACCtB
			s.InnerSrcIP, s.InnerDstIP = testbed.OverlayA, testbed.OverlayB
		}
		out = append(out, s.Build())
	}
	return out
}

// Agent is a running agent process, seen from the benchmark.
type Agent struct {
	role  string
	cmd   *testbed.Command
	lines *bufio.Scanner
	errb  *strings.Builder
}

// StartAgent starts an agent in node n pinned to cpus and waits until it is
// ready (bounded by a deadline, never by a sleep).
func StartAgent(c testbed.Config, n testbed.Node, cpus []int, a AgentArgs) (*Agent, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	return StartProcess(c, n, cpus, a.Role, a.Argv(self), func(l string) bool { return l == "ready" })
}

// StartAgentAt starts an agent in the namespace file nsPath (a node of
// package nodes) pinned to cpus and waits until it is ready.
func StartAgentAt(nsPath string, cpus []int, a AgentArgs) (*Agent, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	return startCommand(testbed.NewCommandAt(nsPath, cpus, a.Argv(self)...), filepath.Base(nsPath), a.Role, func(l string) bool { return l == "ready" })
}

// StartProcess starts argv in node n pinned to cpus and waits, at most 10
// s, for a line of its standard output for which ready returns true.
func StartProcess(c testbed.Config, n testbed.Node, cpus []int, role string, argv []string, ready func(string) bool) (*Agent, error) {
	return startCommand(testbed.NewCommand(c, n, cpus, argv...), string(n), role, ready)
}

// startCommand starts cmd (in the namespace where names) and waits, at
// most 10 s, for a line of its standard output for which ready returns
// true.
func startCommand(cmd *testbed.Command, where, role string, ready func(string) bool) (*Agent, error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	eb := &strings.Builder{}
	cmd.Stderr = eb
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", role, err)
	}
	ag := &Agent{role: role, cmd: cmd, lines: bufio.NewScanner(stdout), errb: eb}
	ag.lines.Buffer(make([]byte, 1<<20), 256<<20)
	readyc := make(chan bool, 1)
	go func() {
		for ag.lines.Scan() {
			if ready(ag.lines.Text()) {
				readyc <- true
				return
			}
		}
		readyc <- false
	}()
	select {
	case ok := <-readyc:
		if !ok {
			err := cmd.Wait()
			return nil, fmt.Errorf("%s in %s did not start: %v: %s", role, where, err, strings.TrimSpace(eb.String()))
		}
	case <-time.After(10 * time.Second):
		ag.Kill()
		return nil, fmt.Errorf("%s in %s: not ready after 10s", role, where)
	}
	return ag, nil
}

// Result waits for the agent's JSON result line (after stop, or at the end
// of its own duration) and decodes it into v.
func (ag *Agent) Result(v any) error {
	var line string
	if ag.lines.Scan() {
		line = ag.lines.Text()
	}
	werr := ag.cmd.Wait()
	if line == "" {
		return fmt.Errorf("%s agent gave no result (%v): %s", ag.role, werr, strings.TrimSpace(ag.errb.String()))
	}
	if err := json.Unmarshal([]byte(line), v); err != nil {
		return fmt.Errorf("decode %s agent result: %w", ag.role, err)
	}
	return nil
}

// Stop asks the agent to finish (SIGTERM to the PID we started) and reads
// its result.
func (ag *Agent) Stop(v any) error {
	ag.cmd.Process.Signal(syscall.SIGTERM)
	return ag.Result(v)
}

// Interrupt asks the agent to end early (SIGINT); its result still
// follows.
func (ag *Agent) Interrupt() {
	ag.cmd.Process.Signal(os.Interrupt)
}

// DiscardOutput reads the process's output to its end, so that a process
// that is not an agent never blocks on a full pipe.
func (ag *Agent) DiscardOutput() {
	for ag.lines.Scan() {
	}
}

// Kill ends the agent without waiting for a result.
func (ag *Agent) Kill() {
	ag.cmd.Process.Kill()
	ag.cmd.Wait()
}
