package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/workload"
)

// Operations of the socket's JSON-lines protocol: one Request a line, one
// Response a line back, on one connection as many as the client sends.
const (
	OpStatus   = "status"
	OpLanesAdd = "lanes.add"
	OpLanesDel = "lanes.del"
	OpSync     = "lanes.sync"
	OpReload   = "reload"
	// OpWorkloadSet and OpWorkloadDel carry an orchestrator's lane
	// request for one workload (the CNI plugin's ADD and DEL).
	OpWorkloadSet = "workload.set"
	OpWorkloadDel = "workload.del"
	// OpManages asks whether the agent owns a namespace's lane or
	// steering (Request.What "lanes" or "steering"), or the node's
	// isolation ("isolation"): the CLI then refuses to enable, disable
	// or apply them behind the agent's back (one writer).
	OpManages = "manages"
)

// What an OpManages request asks about.
const (
	WhatLanes     = "lanes"
	WhatSteering  = "steering"
	WhatIsolation = "isolation"
)

// Manages answers OpManages.
type Manages struct {
	Managed bool `json:"managed"`
	// Entry is the config entry that owns it (e.g. "steering[0]"), on
	// Line of Config.
	Entry  string `json:"entry,omitempty"`
	Line   int    `json:"line,omitempty"`
	Config string `json:"config,omitempty"`
}

// Error codes of a Response.
const (
	// CodeUnmanaged: the agent does not manage this namespace's lane
	// (the CLI then changes it directly, as without an agent).
	CodeUnmanaged = "unmanaged"
	// CodeInvalid: a bad rule (the CLI's usage error).
	CodeInvalid = "invalid"
	// CodeNoRule: no rule with that ID.
	CodeNoRule = "no_rule"
	// CodeConfigRule: the rule is the configuration's; change it there.
	CodeConfigRule = "config_rule"
	// CodeDenied: the peer is not root.
	CodeDenied = "denied"
	// CodeFailed: anything else.
	CodeFailed = "failed"
)

// Request is one line a client sends.
type Request struct {
	Op string `json:"op"`
	// Netns is the namespace as the client spelled it (for messages);
	// NetnsID its identity (netns.Ref.ID), which selects the lane.
	Netns   string    `json:"netns,omitempty"`
	NetnsID string    `json:"netns_id,omitempty"`
	Rule    *RuleSpec `json:"rule,omitempty"`
	ID      int       `json:"id,omitempty"`
	// What is the subject of OpManages.
	What string `json:"what,omitempty"`
	// Workload is the workload of OpWorkloadSet (of OpWorkloadDel only
	// Source and ID count).
	Workload *workload.Workload `json:"workload,omitempty"`
}

// RuleSpec is policy.Spec on the wire.
type RuleSpec struct {
	Dst   string `json:"dst,omitempty"`
	Src   string `json:"src,omitempty"`
	Proto string `json:"proto,omitempty"`
	Port  string `json:"port,omitempty"`
	VNI   string `json:"vni,omitempty"`
}

// Response answers one Request.
type Response struct {
	OK     bool            `json:"ok"`
	Error  string          `json:"error,omitempty"`
	Code   string          `json:"code,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// RemoteError is an error the agent answered with.
type RemoteError struct{ Code, Msg string }

func (e *RemoteError) Error() string { return e.Msg }

// ErrNoAgent: no agent listens on the socket (no socket file, or a stale
// one left by a killed agent).
var ErrNoAgent = errors.New("no rxlane agent is running")

// Client is a connection to the agent's socket.
type Client struct {
	conn *net.UnixConn
	rd   *bufio.Reader
}

// Dial connects to the agent's socket at path. It returns ErrNoAgent when
// nothing listens there (the file is missing, or is a stale socket whose
// agent is gone: connection refused).
func Dial(path string) (*Client, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ECONNREFUSED) {
		return nil, ErrNoAgent
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the agent at %s: %w", path, err)
	}
	return &Client{conn: c, rd: bufio.NewReader(c)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends req and decodes the result into result (if not nil). An
// error of the agent is a *RemoteError.
func (c *Client) Call(req Request, result any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	c.conn.SetDeadline(time.Now().Add(2 * time.Minute))
	_, werr := c.conn.Write(append(b, '\n'))
	// An answer may be there even when the write failed (a refused
	// peer is answered at once).
	line, err := c.rd.ReadBytes('\n')
	if err != nil && werr != nil {
		return fmt.Errorf("send to the agent: %w", werr)
	}
	if err != nil {
		return fmt.Errorf("read the agent's answer: %w", err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return fmt.Errorf("the agent's answer: %w", err)
	}
	if !resp.OK {
		return &RemoteError{Code: resp.Code, Msg: resp.Error}
	}
	if result != nil && len(resp.Result) > 0 {
		return json.Unmarshal(resp.Result, result)
	}
	return nil
}

// server is the agent's socket.
type server struct {
	ln     *net.UnixListener
	agent  *Agent
	wg     sync.WaitGroup
	mu     sync.Mutex // guards conns, closed and wg.Add against close's Wait
	conns  map[*net.UnixConn]bool
	closed bool
}

// listen makes the socket: its directory (0700 when created here), a
// stale socket of a killed agent removed (nothing answers it), the
// socket itself 0600. A socket an agent answers is not touched.
func listen(path string, a *Agent) (*server, error) {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create socket dir: %w", err)
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s: exists and is not a socket", path)
		}
		c, err := Dial(path)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: socket %s answers", ErrAgentRunning, path)
		}
		if !errors.Is(err, ErrNoAgent) {
			return nil, err
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	// The socket is created with the umask's mode: make it 0600 before
	// anyone could use it (the directory is root's).
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return &server{ln: ln, agent: a, conns: map[*net.UnixConn]bool{}}, nil
}

func (s *server) close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	s.wg.Wait()
}

func (s *server) serve() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.handleConn(c)
		}()
	}
}

// peerUID is the connecting process's uid (SO_PEERCRED: taken by the
// kernel at connect, not claimed by the peer).
func peerUID(c *net.UnixConn) (uint32, int32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if cerr != nil {
		return 0, 0, cerr
	}
	return cred.Uid, cred.Pid, nil
}

func (s *server) handleConn(c *net.UnixConn) {
	enc := json.NewEncoder(c)
	uid, pid, err := peerUID(c)
	if err != nil || uid != 0 {
		msg := fmt.Sprintf("permission denied: the agent's socket serves uid 0 only (peer uid %d, pid %d)", uid, pid)
		if err != nil {
			msg = fmt.Sprintf("permission denied: peer credentials: %v", err)
		}
		s.agent.log.Warn("socket peer refused", "uid", uid, "pid", pid)
		enc.Encode(Response{Error: msg, Code: CodeDenied})
		// Take (and ignore) the peer's first request before closing, so
		// that its write does not fail before it reads the answer.
		c.SetReadDeadline(time.Now().Add(time.Second))
		bufio.NewReader(c).ReadBytes('\n')
		return
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var req Request
		var resp Response
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			resp = Response{Error: "bad request: " + err.Error(), Code: CodeInvalid}
		} else {
			resp = s.agent.handle(req)
		}
		if err := enc.Encode(resp); err != nil {
			return
		}
	}
}

// handle answers one request.
func (a *Agent) handle(req Request) Response {
	var result any
	var err error
	switch req.Op {
	case OpStatus:
		result = a.Status()
	case OpLanesAdd:
		result, err = a.addRule(req)
	case OpLanesDel:
		result, err = a.delRule(req)
	case OpSync:
		result, err = a.syncLane(req)
	case OpReload:
		err = a.Reload()
	case OpManages:
		result, err = a.manages(req)
	case OpWorkloadSet, OpWorkloadDel:
		if req.Workload == nil {
			err = &RemoteError{Code: CodeInvalid, Msg: req.Op + ": no workload"}
		} else if req.Op == OpWorkloadSet {
			err = a.SetWorkload(*req.Workload)
		} else {
			err = a.RemoveWorkload(req.Workload.Source, req.Workload.ID)
		}
	default:
		err = &RemoteError{Code: CodeInvalid, Msg: fmt.Sprintf("unknown op %q (want %s)", req.Op,
			strings.Join([]string{OpStatus, OpLanesAdd, OpLanesDel, OpSync, OpReload, OpWorkloadSet, OpWorkloadDel, OpManages}, ", "))}
	}
	if err != nil {
		var re *RemoteError
		if !errors.As(err, &re) {
			re = &RemoteError{Code: CodeFailed, Msg: err.Error()}
		}
		a.log.Info("socket request failed", "op", req.Op, "netns", req.Netns, "error", re.Msg)
		return Response{Error: re.Msg, Code: re.Code}
	}
	b, err := json.Marshal(result)
	if err != nil {
		return Response{Error: err.Error(), Code: CodeFailed}
	}
	return Response{OK: true, Result: b}
}

// laneFor is the running lane of the request's namespace. Called with
// a.mu held.
func (a *Agent) laneFor(req Request) (*laneRun, error) {
	for _, lr := range a.lanes {
		if lr.store.NS.ID() == req.NetnsID {
			return lr, nil
		}
	}
	return nil, &RemoteError{Code: CodeUnmanaged, Msg: fmt.Sprintf("the agent does not manage the lane of namespace %q", req.Netns)}
}

func (a *Agent) addRule(req Request) (policy.Rule, error) {
	if req.Rule == nil {
		return policy.Rule{}, &RemoteError{Code: CodeInvalid, Msg: "lanes.add: no rule"}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	lr, err := a.laneFor(req)
	if err != nil {
		return policy.Rule{}, err
	}
	s := req.Rule
	r, err := policy.Parse(policy.Spec{Dst: s.Dst, Src: s.Src, Proto: s.Proto, Port: s.Port, VNI: s.VNI})
	if err != nil {
		return policy.Rule{}, &RemoteError{Code: CodeInvalid, Msg: err.Error()}
	}
	for _, c := range lr.cfg.Rules {
		if sameMatch(c.Rule, r) || policy.Overlaps(c.Rule, r) {
			return policy.Rule{}, &RemoteError{Code: CodeInvalid, Msg: fmt.Sprintf("%v: matches packets of the rule %s of the agent's config (%s line %d)", policy.ErrInvalid, c.Rule, a.cfg.File, c.Line)}
		}
	}
	start := time.Now()
	r, err = lr.store.AddRule(r)
	a.reconciled(lr, start, err)
	if errors.Is(err, policy.ErrInvalid) {
		return r, &RemoteError{Code: CodeInvalid, Msg: err.Error()}
	}
	if err != nil {
		return r, err
	}
	id := lr.store.NS.ID()
	rt := r
	rt.ID = 0
	a.runtime[id] = append(a.runtime[id], rt)
	if err := a.saveRuntime(); err != nil {
		return r, fmt.Errorf("rule %d applied, but not saved for the agent's restart: %w", r.ID, err)
	}
	a.log.Info("runtime rule added", "netns", lr.cfg.Netns, "rule", r.String(), "id", r.ID)
	return r, nil
}

func (a *Agent) delRule(req Request) (policy.Rule, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lr, err := a.laneFor(req)
	if err != nil {
		return policy.Rule{}, err
	}
	set, err := lr.store.Rules()
	if err != nil {
		return policy.Rule{}, err
	}
	i := slices.IndexFunc(set.Rules, func(r policy.Rule) bool { return r.ID == req.ID })
	if i < 0 {
		return policy.Rule{}, &RemoteError{Code: CodeNoRule, Msg: fmt.Sprintf("rule %d: %v", req.ID, policy.ErrNoRule)}
	}
	r := set.Rules[i]
	for _, c := range lr.cfg.Rules {
		if sameMatch(c.Rule, r) {
			return r, &RemoteError{Code: CodeConfigRule, Msg: fmt.Sprintf("rule %d (%s) is in the agent's config (%s line %d): remove it there and reload", r.ID, r, a.cfg.File, c.Line)}
		}
	}
	start := time.Now()
	r, err = lr.store.DelRule(req.ID)
	a.reconciled(lr, start, err)
	if err != nil {
		return r, err
	}
	id := lr.store.NS.ID()
	a.runtime[id] = slices.DeleteFunc(a.runtime[id], func(o policy.Rule) bool { return sameMatch(o, r) })
	if err := a.saveRuntime(); err != nil {
		return r, fmt.Errorf("rule %d deleted, but the agent's saved rules were not updated: %w", r.ID, err)
	}
	a.log.Info("runtime rule deleted", "netns", lr.cfg.Netns, "rule", r.String(), "id", r.ID)
	return r, nil
}

// manages says which config entry, if any, owns what the request names.
func (a *Agent) manages(req Request) (Manages, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := Manages{Config: a.opts.ConfigFile}
	switch req.What {
	case WhatLanes:
		for i, l := range a.cfg.Lanes {
			if l.NS.ID() == req.NetnsID {
				m.Managed, m.Entry, m.Line = true, fmt.Sprintf("lanes[%d]", i), l.Line
			}
		}
	case WhatSteering:
		for i, c := range a.cfg.Steering {
			if c.NS.ID() == req.NetnsID {
				m.Managed, m.Entry, m.Line = true, fmt.Sprintf("steering[%d]", i), c.Line
			}
		}
	case WhatIsolation:
		if p := a.cfg.Isolation; p != nil {
			m.Managed, m.Entry, m.Line = true, "isolation", p.Line
		}
	default:
		return m, &RemoteError{Code: CodeInvalid, Msg: fmt.Sprintf("manages: what %q: want %s, %s or %s", req.What, WhatLanes, WhatSteering, WhatIsolation)}
	}
	return m, nil
}

func (a *Agent) syncLane(req Request) (any, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lr, err := a.laneFor(req)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	topo, err := lr.store.Sync()
	a.reconciled(lr, start, err)
	return topo, err
}

// Status is the agent's answer to "status".
type Status struct {
	Config   string        `json:"config"`
	Ready    bool          `json:"ready"`
	Lanes    []LaneStatus  `json:"lanes"`
	Steering []SteerStatus `json:"steering"`
	// Workloads are the orchestrators' lane requests the agent holds.
	Workloads []WorkloadStatus `json:"workloads"`
}

// WorkloadStatus is a workload and whether the lanes can serve it.
type WorkloadStatus struct {
	workload.Workload
	// Served: the lanes that take workloads serve every address of the
	// workload in its lane. Unserved, when not, says why: an endpoint
	// that needs a filter skipped (a routed pod on Flannel or Calico,
	// bridge netfilter on), or one not discovered yet.
	Served   bool   `json:"served"`
	Unserved string `json:"unserved,omitempty"`
}

// LaneStatus is one lanes entry's state.
type LaneStatus struct {
	Netns   string       `json:"netns"`
	NetnsID string       `json:"netns_id"`
	Mode    string       `json:"mode"`
	Error   string       `json:"error,omitempty"`
	Rules   []RuleStatus `json:"rules"`
}

// RuleStatus is a stored rule and where it comes from.
type RuleStatus struct {
	policy.Rule
	// Source is "config" (Line is its line), "runtime" (added through
	// the socket, kept across the agent's restarts until deleted) or
	// "workload" (Workload is its key: an orchestrator's request).
	Source   string `json:"source"`
	Line     int    `json:"line,omitempty"`
	Workload string `json:"workload,omitempty"`
}

// SteerStatus is one steering entry's state.
type SteerStatus struct {
	Netns string `json:"netns"`
	Mode  string `json:"mode"`
	Error string `json:"error,omitempty"`
}

// Status reports the agent's entries.
func (a *Agent) Status() Status {
	ready := a.Ready()
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Config: a.opts.ConfigFile, Ready: ready, Lanes: []LaneStatus{}, Steering: []SteerStatus{}, Workloads: []WorkloadStatus{}}
	for _, w := range a.workloads {
		ws := WorkloadStatus{Workload: w}
		ws.Served, ws.Unserved = a.served(w)
		s.Workloads = append(s.Workloads, ws)
	}
	slices.SortFunc(s.Workloads, func(x, y WorkloadStatus) int { return strings.Compare(x.Key(), y.Key()) })
	for _, l := range a.cfg.Lanes {
		lr := a.lanes[l.NS.Ino]
		if lr == nil {
			continue
		}
		ls := LaneStatus{Netns: l.Netns, NetnsID: lr.store.NS.ID(), Mode: l.Mode, Rules: []RuleStatus{}}
		if e := lr.lastErr.Load(); e != nil {
			ls.Error = *e
		}
		if set, err := lr.store.Rules(); err == nil {
			for _, r := range set.Rules {
				rs := RuleStatus{Rule: r, Source: "runtime"}
				for _, c := range l.Rules {
					if sameMatch(c.Rule, r) {
						rs.Source, rs.Line = "config", c.Line
					}
				}
				if rs.Source == "runtime" && l.Workloads {
					if w, ok := a.workloadOf(r); ok {
						rs.Source, rs.Workload = "workload", w.Key()
					}
				}
				ls.Rules = append(ls.Rules, rs)
			}
		}
		s.Lanes = append(s.Lanes, ls)
	}
	for _, c := range a.cfg.Steering {
		sr := a.steers[c.NS.Ino]
		if sr == nil {
			continue
		}
		ss := SteerStatus{Netns: c.Netns, Mode: c.Mode}
		if e := sr.lastErr.Load(); e != nil {
			ss.Error = *e
		}
		s.Steering = append(s.Steering, ss)
	}
	return s
}
