package cni

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/rxlane/rxlane/internal/agent"
	"github.com/rxlane/rxlane/internal/workload"
)

// About is what the plugin prints on stderr when run without
// CNI_COMMAND (skel's convention).
const About = "rxlane-cni: chained CNI plugin that registers a container's lane request with the rxlane node agent"

// Versions are the CNI spec versions the plugin supports: all of them
// (0.1.0 to 1.1.0; CHECK from 0.4.0, STATUS from 1.1.0, as skel
// enforces).
var Versions = version.All

// DefaultTimeout bounds one exchange with the agent: an agent that hangs
// must not hold a container's start (it is then treated as down).
const DefaultTimeout = 10 * time.Second

// Plugin runs the CNI commands. Stdout gets the result (CNI keeps stdout
// for it), Stderr the warnings.
type Plugin struct {
	Stdout, Stderr io.Writer
	Timeout        time.Duration
}

// New is a plugin writing to the process's stdout and stderr.
func New() *Plugin {
	return &Plugin{Stdout: os.Stdout, Stderr: os.Stderr, Timeout: DefaultTimeout}
}

// Funcs are the commands for skel.PluginMainFuncs. GC is not handled
// (skel answers it with success): the plugin's state is the agent's,
// which a DEL, a pending record or the pod watcher's resync removes.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status}
}

func (p *Plugin) warn(format string, args ...any) {
	fmt.Fprintf(p.Stderr, "rxlane-cni: warning: "+format+"\n", args...)
}

// call sends req to the agent at socket, bounded by p.Timeout (a timeout
// is reported as agent.ErrNoAgent's kin: the caller leaves a pending
// record).
func (p *Plugin) call(socket string, req agent.Request, result any) error {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	done := make(chan error, 1)
	go func() {
		c, err := agent.Dial(socket)
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		done <- c.Call(req, result)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		// The goroutine ends with the process (a CNI plugin runs one
		// command).
		return fmt.Errorf("the agent at %s did not answer within %s", socket, timeout)
	}
}

// request reads the container's lane request and workload from the
// command's input.
func request(args *skel.CmdArgs) (*NetConf, LaneRequest, string, workload.Workload, error) {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return nil, LaneRequest{}, "", workload.Workload{}, err
	}
	a, err := ParseArgs(args.Args)
	if err != nil {
		return nil, LaneRequest{}, "", workload.Workload{}, err
	}
	req, from, err := Request(conf, a)
	if err != nil {
		return nil, LaneRequest{}, "", workload.Workload{}, err
	}
	w := workload.Workload{
		Source: workload.SourceCNI,
		ID:     WorkloadID(args.ContainerID, args.IfName),
		Lane:   req.Lane, Ports: req.Ports, Proto: req.Proto,
	}
	// Kubernetes runtimes pass the pod's namespace and name; podman
	// passes the container's name as K8S_POD_NAME alone.
	switch {
	case a.PodNamespace != "" && a.PodName != "":
		w.Name = a.PodNamespace + "/" + a.PodName
	case a.PodName != "":
		w.Name = a.PodName
	}
	w.IPs, _, _ = ContainerAddrs(conf.Result, args.IfName)
	return conf, req, from, w, nil
}

// validate checks a lane request against the container's addresses.
func validate(w workload.Workload, from string, conf *NetConf) error {
	if w.ID == "" {
		return cniError(types.ErrInvalidEnvironmentVariables, "rxlane-cni: no CNI_CONTAINERID")
	}
	if err := w.Validate(); err != nil {
		return cniError(ErrInvalidLaneRequest, "rxlane-cni: container %s: lane request from %s: %v", w.ID, from, err)
	}
	if w.InLane() && len(w.IPs) == 0 {
		why := "prevResult has no address of the container"
		if conf.Result == nil {
			why = "no prevResult"
		}
		return cniError(ErrNoAddresses, "rxlane-cni: container %s asks for lane %q but %s: chain rxlane-cni after the plugins that give the container its addresses", w.ID, w.Lane, why)
	}
	return nil
}

// Add registers the container's lane request with the agent and passes
// prevResult through. Without a request (or with the default lane)
// nothing is sent. With the agent down, or failing, the container still
// starts: a warning, and a pending record the agent applies when it
// runs. A request that cannot be given fails (ErrInvalidLaneRequest,
// ErrNoAddresses).
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, _, from, w, err := request(args)
	if err != nil {
		return err
	}
	result := conf.Result
	if result == nil {
		result = &types100.Result{CNIVersion: types100.ImplementedSpecVersion}
	}
	if err := validate(w, from, conf); err != nil {
		return err
	}
	if w.InLane() {
		switch err := p.call(conf.Socket, agent.Request{Op: agent.OpWorkloadSet, Workload: &w}, nil); {
		case err == nil:
		case isInvalid(err):
			return cniError(ErrInvalidLaneRequest, "rxlane-cni: container %s: the agent refused the lane request from %s: %v", w.ID, from, err)
		default:
			p.pending(conf, workload.OpSet, w, err)
		}
	}
	return printResult(p.Stdout, conf, result)
}

func printResult(w io.Writer, conf *NetConf, r types.Result) error {
	out, err := r.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return cniError(types.ErrIncompatibleCNIVersion, "rxlane-cni: prevResult as version %s: %v", conf.CNIVersion, err)
	}
	if err := out.PrintTo(w); err != nil {
		return cniError(types.ErrIOFailure, "rxlane-cni: print result: %v", err)
	}
	return nil
}

func isInvalid(err error) bool {
	var re *agent.RemoteError
	return errors.As(err, &re) && re.Code == agent.CodeInvalid
}

// pending leaves a record for the agent after err (the agent is down,
// hangs or failed); a record that cannot be written is a warning too:
// the container must start.
func (p *Plugin) pending(conf *NetConf, op string, w workload.Workload, err error) {
	dir := conf.PendingDir()
	if errors.Is(err, agent.ErrNoAgent) {
		p.warn("%s: no agent answers at %s; leaving a pending %s record in %s for the agent to apply when it starts", w, conf.Socket, op, dir)
	} else {
		p.warn("%s: agent at %s: %v; leaving a pending %s record in %s for the agent's next look", w, conf.Socket, err, op, dir)
	}
	if err := workload.WritePending(dir, op, w); err != nil {
		p.warn("%s: %v (the lane request is lost: set it again with the agent running)", w, err)
	}
}

// Del removes the container's lane request from the agent: always asked
// (the request of the ADD may not be in DEL's input), harmless when the
// agent does not know it, so a second DEL or a DEL of a container that
// is gone succeeds. With the agent down, a pending DEL record replaces
// any pending record of the container. DEL fails only on an input it
// cannot read.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if _, err := ParseArgs(args.Args); err != nil {
		return err
	}
	if args.ContainerID == "" {
		return cniError(types.ErrInvalidEnvironmentVariables, "rxlane-cni: no CNI_CONTAINERID")
	}
	w := workload.Workload{Source: workload.SourceCNI, ID: WorkloadID(args.ContainerID, args.IfName)}
	if err := p.call(conf.Socket, agent.Request{Op: agent.OpWorkloadDel, Workload: &w}, nil); err != nil {
		p.pending(conf, workload.OpDel, w, err)
		return nil
	}
	// A record the ADD left while the agent failed, not yet applied,
	// would bring the request back after this DEL: replace it (a DEL
	// record of a workload the agent does not know is a no-op).
	if hasPending(conf.PendingDir()) {
		if err := workload.WritePending(conf.PendingDir(), workload.OpDel, w); err != nil {
			p.warn("%s: %v", w, err)
		}
	}
	return nil
}

// hasPending reports whether dir holds records not yet taken.
func hasPending(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(ents, func(e os.DirEntry) bool {
		return !strings.HasPrefix(e.Name(), ".") && strings.HasSuffix(e.Name(), ".json")
	})
}

// Check verifies the input as ADD does (prevResult required) and, for a
// container that asks for a lane, that a running agent holds a lane
// request for the container's addresses (its own, or the pod watcher's
// for the same pod). With no agent running it succeeds: the pending
// record, or the agent's pod watcher, covers it.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, _, from, w, err := request(args)
	if err != nil {
		return err
	}
	if conf.Result == nil {
		return cniError(types.ErrInvalidNetworkConfig, "rxlane-cni: CHECK needs prevResult")
	}
	if err := validate(w, from, conf); err != nil {
		return err
	}
	if !w.InLane() {
		return nil
	}
	var st agent.Status
	switch err := p.call(conf.Socket, agent.Request{Op: agent.OpStatus}, &st); {
	case errors.Is(err, agent.ErrNoAgent):
		p.warn("%s: no agent answers at %s: not checked", w, conf.Socket)
		return nil
	case err != nil:
		return cniError(types.ErrTryAgainLater, "rxlane-cni: CHECK: ask the agent at %s: %v", conf.Socket, err)
	}
	if !covered(w, st.Workloads) {
		return cniError(ErrNotRegistered, "rxlane-cni: CHECK: the agent at %s holds no lane %q request for %s (addresses %v)", conf.Socket, w.Lane, w, w.IPs)
	}
	return nil
}

// covered reports whether every address of w is in the lane of some
// workload the agent holds.
func covered(w workload.Workload, have []agent.WorkloadStatus) bool {
	for _, ip := range w.IPs {
		if !slices.ContainsFunc(have, func(o agent.WorkloadStatus) bool {
			return o.InLane() && slices.Contains(o.IPs, ip) && (o.Key() == w.Key() || samePorts(o.Workload, w))
		}) {
			return false
		}
	}
	return true
}

func samePorts(a, b workload.Workload) bool {
	return strings.ReplaceAll(a.Ports, " ", "") == strings.ReplaceAll(b.Ports, " ", "") &&
		normProto(a.Proto) == normProto(b.Proto)
}

func normProto(p string) string {
	p = strings.ToLower(strings.TrimSpace(p))
	if p == "any" {
		return ""
	}
	return p
}

// Status (spec 1.1.0) reports the plugin ready whenever its
// configuration is valid: ADD works without an agent (pending records),
// so an agent that is down must not mark the node's network not ready.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	_, err := ParseConfig(args.StdinData)
	return err
}

// Run is the binary's main: the CNI commands through skel, errors as CNI
// error JSON on stdout with exit status 1.
func Run() {
	skel.PluginMainFuncs(New().Funcs(), Versions, About)
}
