// Package agent is rxlane's node agent: it reads one YAML configuration,
// reconciles the kernel towards it (lanes through their Store, steering
// through internal/steer), keeps it current, and is the single writer of
// the lanes it owns while it runs (a root-only Unix socket takes the CLI's
// changes).
package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rxlane/rxlane/internal/isolate"
	"github.com/rxlane/rxlane/internal/lanes"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/steer"
)

// Defaults of the configuration's top-level fields.
const (
	DefaultStateDir       = "/run/rxlane"
	DefaultSocket         = "/run/rxlane/agent.sock"
	DefaultMetricsAddress = "127.0.0.1:9464"
)

// Steering modes a configuration may name.
const (
	SteerStatic  = "static"  // hash choice only
	SteerDynamic = "dynamic" // FALCON's two choices with load
	SteerCpumap  = "cpumap"  // dynamic, and the first stage moved off the polling CPU with XDP
)

// Config is a validated agent configuration.
type Config struct {
	// File is where it was read from (in messages).
	File string `json:"file"`
	// StateDir holds the lanes' stores (StateDir/lanes, the directory
	// `rxlane lanes` uses by default), steering's journals (StateDir/steer)
	// and the agent's own state (StateDir/agent).
	StateDir string `json:"state_dir"`
	// Socket is the agent's Unix socket.
	Socket string `json:"socket"`
	// MetricsAddress is where the metrics exporter listens (stored for
	// the exporter; the agent itself serves no HTTP).
	MetricsAddress string         `json:"metrics_address"`
	Lanes          []LaneConfig   `json:"lanes,omitempty"`
	Steering       []SteerConfig  `json:"steering,omitempty"`
	Isolation      *IsolationPlan `json:"isolation,omitempty"`
	// Docker, if set, is the engine whose labelled containers get lanes.
	Docker *DockerConfig `json:"docker,omitempty"`
	// Kubernetes, if set, starts the pod watcher (kube.go).
	Kubernetes *KubernetesConfig `json:"kubernetes,omitempty"`
}

// LanesDir is the lanes' store directory.
func (c *Config) LanesDir() string { return filepath.Join(c.StateDir, "lanes") }

// SteerDir is steering's journal directory.
func (c *Config) SteerDir() string { return filepath.Join(c.StateDir, "steer") }

// AgentDir holds the agent's own state (runtime rules, its lock).
func (c *Config) AgentDir() string { return filepath.Join(c.StateDir, "agent") }

// LaneConfig is one lanes entry: a namespace's lane and its rules.
type LaneConfig struct {
	Netns string    `json:"netns"`
	NS    netns.Ref `json:"-"`
	Line  int       `json:"line"`
	// Device is the underlay device to attach to ("": every underlay of
	// the namespace's VXLAN devices).
	Device         string       `json:"device,omitempty"`
	Mode           string       `json:"mode"`
	SkipNetfilter  bool         `json:"skip_netfilter"`
	TrustOuterCsum bool         `json:"trust_outer_csum"`
	Rules          []ConfigRule `json:"rules"`
	// Workloads lets workloads join this lane: the CNI plugin's, the
	// pod annotations' and the container labels' requests become rules
	// for the workloads' own addresses (docs/orchestrators.md).
	Workloads bool `json:"workloads"`
}

// Options are the lane's options for lanes.Store.Enable.
func (l LaneConfig) Options() lanes.Options {
	return lanes.Options{Device: l.Device, Mode: l.Mode, SkipNetfilter: l.SkipNetfilter, TrustOuterCsum: l.TrustOuterCsum}
}

// ConfigRule is a rule of the configuration and the line it is on.
type ConfigRule struct {
	policy.Rule
	Line int `json:"line"`
}

// SteerConfig is one steering entry.
type SteerConfig struct {
	Netns string    `json:"netns"`
	NS    netns.Ref `json:"-"`
	Line  int       `json:"line"`
	Mode  string    `json:"mode"`
	// ModeLine is the mode field's line (the entry's when not given).
	ModeLine int `json:"-"`
	// Options are steer.Enable's (StateFile and StartOff are set by the
	// agent).
	Options steer.Options `json:"options"`
	// Follow runs load tracking and the closed loop (`steer enable
	// --follow`); Interval is its load sampling window.
	Follow   bool              `json:"follow"`
	Interval time.Duration     `json:"interval"`
	Loop     steer.LoopOptions `json:"loop"`
}

// IsolationPlan is the configuration's isolation plan (validated; see
// docs/agent.md for what the agent does with it).
type IsolationPlan struct {
	Spec isolate.Spec `json:"spec"`
	Line int          `json:"line"`
}

// Problem is one error of a configuration, at a line and a field path.
type Problem struct {
	File string
	Line int
	Path string
	Msg  string
}

func (p Problem) Error() string {
	loc := p.File
	if p.Line > 0 {
		loc = fmt.Sprintf("%s:%d", p.File, p.Line)
	}
	if p.Path == "" {
		return loc + ": " + p.Msg
	}
	return loc + ": " + p.Path + ": " + p.Msg
}

// ConfigError lists every problem found in a configuration, one a line.
type ConfigError struct{ Problems []Problem }

func (e *ConfigError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Error())
	}
	return b.String()
}

// LoadConfig reads, validates and resolves a configuration file: every
// namespace it names must exist. Errors are a *ConfigError.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(filepath.Base(path), b)
}

// ParseConfig is LoadConfig on data read from a file named name.
func ParseConfig(name string, data []byte) (*Config, error) {
	d := &decoder{file: name}
	cfg := d.config(data)
	if len(d.problems) > 0 {
		return nil, &ConfigError{d.problems}
	}
	cfg.File = name
	return cfg, nil
}

type decoder struct {
	file     string
	problems []Problem
	// keyLine is the line of the key of each mapping or list value: a
	// block value starts on the line after its key, but the field is
	// named where its key is.
	keyLine map[*yaml.Node]int
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
		if l, ok := d.keyLine[n]; ok {
			line = l
		}
	}
	d.problems = append(d.problems, Problem{File: d.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// kind names a node's kind for "want X, got Y" messages.
func kind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}

// fields checks that n is a mapping with only the known keys (each at
// most once) and returns the value nodes by key.
func (d *decoder) fields(n *yaml.Node, path string, known ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping, got %s", kind(n))
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		kp := join(path, k.Value)
		switch {
		case !slices.Contains(known, k.Value):
			d.fail(k, kp, "unknown field (known: %s)", strings.Join(known, ", "))
		case out[k.Value] != nil:
			d.fail(k, kp, "given twice (first at line %d)", out[k.Value].Line)
		default:
			out[k.Value] = v
			if v.Kind == yaml.MappingNode || v.Kind == yaml.SequenceNode {
				if d.keyLine == nil {
					d.keyLine = map[*yaml.Node]int{}
				}
				d.keyLine[v] = k.Line
			}
		}
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		d.fail(n, path, "want a string, got %s", kind(n))
		return "", false
	}
	return n.Value, true
}

func (d *decoder) boolean(n *yaml.Node, path string) (bool, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		d.fail(n, path, "want true or false, got %s", kind(n))
		return false, false
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		d.fail(n, path, "want true or false, got %s", kind(n))
		return false, false
	}
	return b, true
}

func (d *decoder) number(n *yaml.Node, path string) (float64, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		d.fail(n, path, "want a number, got %s", kind(n))
		return 0, false
	}
	f, err := strconv.ParseFloat(n.Value, 64)
	if err != nil {
		d.fail(n, path, "want a number, got %s", kind(n))
		return 0, false
	}
	return f, true
}

func (d *decoder) integer(n *yaml.Node, path string) (int, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		d.fail(n, path, "want a whole number, got %s", kind(n))
		return 0, false
	}
	i, err := strconv.Atoi(n.Value)
	if err != nil {
		d.fail(n, path, "want a whole number, got %s", kind(n))
		return 0, false
	}
	return i, true
}

func (d *decoder) duration(n *yaml.Node, path string) (time.Duration, bool) {
	s, ok := d.str(n, path)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		d.fail(n, path, "%q: want a positive duration such as 500ms or 5s", s)
		return 0, false
	}
	return v, true
}

func (d *decoder) list(n *yaml.Node, path string) []*yaml.Node {
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "want a list, got %s", kind(n))
		return nil
	}
	return n.Content
}

func (d *decoder) strings(n *yaml.Node, path string) []string {
	var out []string
	for i, e := range d.list(n, path) {
		if s, ok := d.str(e, fmt.Sprintf("%s[%d]", path, i)); ok {
			out = append(out, s)
		}
	}
	return out
}

func (d *decoder) absPath(n *yaml.Node, path string) string {
	s, ok := d.str(n, path)
	if ok && !filepath.IsAbs(s) {
		d.fail(n, path, "%q: want an absolute path", s)
	}
	return s
}

// cpus parses a CPU list and checks every CPU is online here.
func (d *decoder) cpus(n *yaml.Node, path string) ([]int, bool) {
	s, ok := d.str(n, path)
	if !ok {
		return nil, false
	}
	set, err := isolate.ParseCPUList(s)
	if err != nil {
		d.fail(n, path, "%q: want a CPU list such as 0-3,6 (%v)", s, err)
		return nil, false
	}
	if len(set) == 0 {
		d.fail(n, path, "empty CPU list")
		return nil, false
	}
	online := onlineCPUs()
	for _, c := range set {
		if online != nil && !slices.Contains(online, c) {
			d.fail(n, path, "%q: CPU %d is not online on this node (online: %s)", s, c, onlineText)
			return nil, false
		}
	}
	return set, true
}

// onlineText is /sys/devices/system/cpu/online as read.
var onlineText string

// onlineCPUs are this node's online CPUs (nil when unknown).
func onlineCPUs() []int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil
	}
	onlineText = strings.TrimSpace(string(b))
	set, err := isolate.ParseCPUList(onlineText)
	if err != nil {
		return nil
	}
	return set
}

func (d *decoder) config(data []byte) *Config {
	cfg := &Config{StateDir: DefaultStateDir, Socket: DefaultSocket, MetricsAddress: DefaultMetricsAddress}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := yamlError(err)
		d.problems = append(d.problems, Problem{File: d.file, Line: line, Msg: msg})
		return cfg
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		d.fail(nil, "", "empty configuration: want at least one lanes or steering entry")
		return cfg
	}
	root := doc.Content[0]
	f := d.fields(root, "", "state_dir", "socket", "metrics_address", "lanes", "steering", "isolation", "docker", "kubernetes")
	if n := f["state_dir"]; n != nil {
		cfg.StateDir = d.absPath(n, "state_dir")
	}
	if n := f["socket"]; n != nil {
		cfg.Socket = d.absPath(n, "socket")
	}
	if n := f["metrics_address"]; n != nil {
		if s, ok := d.str(n, "metrics_address"); ok {
			if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
				d.fail(n, "metrics_address", "%q: want HOST:PORT such as 127.0.0.1:9464", s)
			}
			cfg.MetricsAddress = s
		}
	}
	if n := f["lanes"]; n != nil {
		for i, e := range d.list(n, "lanes") {
			cfg.Lanes = append(cfg.Lanes, d.lane(e, fmt.Sprintf("lanes[%d]", i)))
		}
	}
	if n := f["steering"]; n != nil {
		for i, e := range d.list(n, "steering") {
			cfg.Steering = append(cfg.Steering, d.steering(e, fmt.Sprintf("steering[%d]", i)))
		}
	}
	if n := f["isolation"]; n != nil {
		cfg.Isolation = d.isolation(n, "isolation")
	}
	if n := f["docker"]; n != nil {
		cfg.Docker = d.docker(n, "docker", cfg.Lanes)
	}
	if n := f["kubernetes"]; n != nil {
		cfg.Kubernetes = d.kubernetes(n, "kubernetes")
	}
	if len(d.problems) == 0 && len(cfg.Lanes) == 0 && len(cfg.Steering) == 0 && cfg.Isolation == nil {
		d.fail(root, "", "nothing to do: want at least one lanes or steering entry")
	}
	d.crossCheck(cfg, f)
	return cfg
}

// yamlError splits yaml.v3's "yaml: line N: msg" into N and msg.
func yamlError(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		num, text, ok := strings.Cut(rest, ": ")
		if n, err := strconv.Atoi(num); ok && err == nil {
			return n, text
		}
	}
	return 0, msg
}

// resolve resolves a namespace spec, naming the field on failure.
func (d *decoder) resolve(n *yaml.Node, path, spec string) (netns.Ref, bool) {
	ref, err := netns.Resolve(spec)
	if err != nil {
		msg := err.Error()
		if errors.Is(err, os.ErrNotExist) {
			msg = fmt.Sprintf("%q: no such network namespace (a name in %s or a path)", spec, netns.Dirs[0])
		}
		d.fail(n, path, "%s", msg)
		return netns.Ref{}, false
	}
	return ref, true
}

func (d *decoder) lane(n *yaml.Node, path string) LaneConfig {
	l := LaneConfig{Line: n.Line, Mode: lanes.ModeSync}
	f := d.fields(n, path, "netns", "device", "mode", "skip_netfilter", "trust_outer_csum", "rules", "workloads")
	if v := f["netns"]; v != nil {
		if s, ok := d.str(v, path+".netns"); ok {
			l.Netns = s
			l.NS, _ = d.resolve(v, path+".netns", s)
		}
	} else if n.Kind == yaml.MappingNode {
		if ref, err := netns.Resolve(""); err == nil {
			l.NS = ref
		}
	}
	if v := f["device"]; v != nil {
		if s, ok := d.str(v, path+".device"); ok {
			if s == "" || len(s) > 15 || strings.ContainsAny(s, "/ :") {
				d.fail(v, path+".device", "%q: not a device name", s)
			}
			l.Device = s
		}
	}
	if v := f["mode"]; v != nil {
		if s, ok := d.str(v, path+".mode"); ok {
			if s != lanes.ModeSync && s != lanes.ModeQueue {
				d.fail(v, path+".mode", "%q: want sync or queue", s)
			}
			l.Mode = s
		}
	}
	if v := f["skip_netfilter"]; v != nil {
		l.SkipNetfilter, _ = d.boolean(v, path+".skip_netfilter")
	}
	if v := f["trust_outer_csum"]; v != nil {
		l.TrustOuterCsum, _ = d.boolean(v, path+".trust_outer_csum")
	}
	if v := f["workloads"]; v != nil {
		l.Workloads, _ = d.boolean(v, path+".workloads")
		// A lane that skips netfilter would let a pod exempt itself
		// from NetworkPolicy by asking for it: only the operator's
		// own rules may skip.
		if l.Workloads && l.SkipNetfilter {
			d.fail(v, path+".workloads", "not with skip_netfilter: a workload would skip the node's filtering (NetworkPolicy) by asking for the lane")
		}
	}
	if v := f["rules"]; v != nil {
		rules := d.list(v, path+".rules")
		if len(rules) > policy.MaxRules {
			d.fail(v, path+".rules", "%d rules: a lane holds at most %d", len(rules), policy.MaxRules)
		}
		for i, e := range rules {
			rp := fmt.Sprintf("%s.rules[%d]", path, i)
			r, ok := d.rule(e, rp)
			if !ok {
				continue
			}
			if j := d.conflicting(l.Rules, r); j >= 0 {
				o := l.Rules[j]
				what := "overlaps"
				if sameMatch(o.Rule, r.Rule) {
					what = "duplicates"
				}
				d.fail(e, rp, "%s %s.rules[%d] (line %d: %s): some packets would match both; narrow one of them", what, path, ruleIndex(rules, o.Line), o.Line, o.Rule)
				continue
			}
			l.Rules = append(l.Rules, r)
		}
	}
	return l
}

// ruleIndex is the index in rules of the rule on line.
func ruleIndex(rules []*yaml.Node, line int) int {
	for i, r := range rules {
		if r.Line == line {
			return i
		}
	}
	return -1
}

func sameMatch(a, b policy.Rule) bool {
	a.ID, b.ID = 0, 0
	return a == b
}

// conflicting is the index of the first rule of have that some packet
// matching r also matches, or -1.
func (d *decoder) conflicting(have []ConfigRule, r ConfigRule) int {
	for i, o := range have {
		if sameMatch(o.Rule, r.Rule) || policy.Overlaps(o.Rule, r.Rule) {
			return i
		}
	}
	return -1
}

// ruleFields are a rule's keys, the flags of `rxlane lanes add`.
var ruleFields = []string{"dst", "src", "proto", "port", "vni"}

// rule parses a rule with policy.Parse (the CLI's parser), attributing
// its error to the field it names.
func (d *decoder) rule(n *yaml.Node, path string) (ConfigRule, bool) {
	f := d.fields(n, path, ruleFields...)
	if n.Kind != yaml.MappingNode {
		return ConfigRule{}, false
	}
	before := len(d.problems)
	var s policy.Spec
	for _, x := range []struct {
		key string
		dst *string
	}{{"dst", &s.Dst}, {"src", &s.Src}, {"proto", &s.Proto}, {"port", &s.Port}, {"vni", &s.VNI}} {
		if v := f[x.key]; v != nil {
			*x.dst, _ = d.str(v, path+"."+x.key)
		}
	}
	if len(d.problems) > before {
		return ConfigRule{}, false
	}
	r, err := policy.Parse(s)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), policy.ErrInvalid.Error()+": ")
		for _, key := range ruleFields {
			if rest, ok := strings.CutPrefix(msg, key+" "); ok && f[key] != nil {
				d.fail(f[key], path+"."+key, "%s", rest)
				return ConfigRule{}, false
			}
		}
		if strings.HasPrefix(msg, "ports ") && f["port"] != nil {
			d.fail(f["port"], path+".port", "%s", msg)
			return ConfigRule{}, false
		}
		d.fail(n, path, "%s", msg)
		return ConfigRule{}, false
	}
	return ConfigRule{Rule: r, Line: n.Line}, true
}

func (d *decoder) steering(n *yaml.Node, path string) SteerConfig {
	s := SteerConfig{Line: n.Line, ModeLine: n.Line, Mode: SteerDynamic, Follow: true, Interval: 200 * time.Millisecond, Loop: steer.DefaultLoopOptions()}
	o := &s.Options
	o.Threshold, o.AvgThreshold, o.Hysteresis = 0.85, 0.85, 0.1
	f := d.fields(n, path, "netns", "mode", "cpus", "first_cpus", "stages", "threshold", "avg_threshold", "hysteresis",
		"local", "sender_tx_off", "follow", "interval", "loop")
	if n.Kind != yaml.MappingNode {
		return s
	}
	before := len(d.problems)
	if v := f["netns"]; v != nil {
		if spec, ok := d.str(v, path+".netns"); ok {
			s.Netns = spec
			s.NS, _ = d.resolve(v, path+".netns", spec)
		}
	} else if ref, err := netns.Resolve(""); err == nil {
		s.NS = ref
	}
	if v := f["mode"]; v != nil {
		if m, ok := d.str(v, path+".mode"); ok {
			switch m {
			case SteerStatic:
				o.Static = true
			case SteerDynamic:
			case SteerCpumap:
				o.FirstStage = steer.FirstStageCpumap
			default:
				d.fail(v, path+".mode", "%q: want static, dynamic or cpumap", m)
			}
			s.Mode, s.ModeLine = m, v.Line
		}
	}
	if v := f["cpus"]; v != nil {
		o.CPUs, _ = d.cpus(v, path+".cpus")
	} else if online := onlineCPUs(); online != nil {
		o.CPUs = online
	}
	if v := f["first_cpus"]; v != nil {
		if s.Mode != SteerCpumap {
			d.fail(v, path+".first_cpus", "only with mode cpumap")
		}
		o.FirstCPUs, _ = d.cpus(v, path+".first_cpus")
	}
	if v := f["stages"]; v != nil {
		o.Stages = d.strings(v, path+".stages")
		for i, st := range o.Stages {
			if st != "vxlan" && st != "veth" && st != "none" {
				d.fail(v.Content[i], fmt.Sprintf("%s.stages[%d]", path, i), "%q: want vxlan, veth or none", st)
			}
		}
	}
	for _, x := range []numField{{"threshold", &o.Threshold}, {"avg_threshold", &o.AvgThreshold}, {"hysteresis", &o.Hysteresis}} {
		if v := f[x.key]; v != nil {
			if val, ok := d.number(v, path+"."+x.key); ok {
				if val <= 0 || val > 1 {
					d.fail(v, path+"."+x.key, "%g: want a share in (0, 1]", val)
				}
				*x.dst = val
			}
		}
	}
	for _, x := range []boolField{{"local", &o.Local}, {"sender_tx_off", &o.SenderTxOff}, {"follow", &s.Follow}} {
		if v := f[x.key]; v != nil {
			*x.dst, _ = d.boolean(v, path+"."+x.key)
		}
	}
	if v := f["interval"]; v != nil {
		s.Interval, _ = d.duration(v, path+".interval")
	}
	if v := f["loop"]; v != nil {
		if !s.Follow {
			d.fail(v, path+".loop", "the closed loop runs only with follow: true")
		}
		d.loop(v, path+".loop", &s.Loop)
	}
	if len(d.problems) == before {
		o.Netns = s.NS.Path
		if err := o.Validate(); err != nil {
			d.fail(n, path, "%s", strings.TrimPrefix(err.Error(), "steer: "))
		}
	}
	return s
}

// numField and boolField name a field and where its value goes (a slice
// of them keeps the order of messages stable).
type numField struct {
	key string
	dst *float64
}

type boolField struct {
	key string
	dst *bool
}

func (d *decoder) loop(n *yaml.Node, path string, lo *steer.LoopOptions) {
	f := d.fields(n, path, "off", "window", "settle", "interval", "max_interval", "min_dwell", "noise_floor", "confirm",
		"min_rate", "load_change", "busy_tasks", "no_park")
	before := len(d.problems)
	for _, x := range []struct {
		key string
		dst *time.Duration
	}{{"window", &lo.Window}, {"settle", &lo.Settle}, {"interval", &lo.Interval}, {"max_interval", &lo.MaxInterval}, {"min_dwell", &lo.MinDwell}} {
		if v := f[x.key]; v != nil {
			*x.dst, _ = d.duration(v, path+"."+x.key)
		}
	}
	for _, x := range []numField{{"noise_floor", &lo.NoiseFloor}, {"min_rate", &lo.MinRate}, {"load_change", &lo.LoadChange}, {"busy_tasks", &lo.BusyTask}} {
		if v := f[x.key]; v != nil {
			*x.dst, _ = d.number(v, path+"."+x.key)
		}
	}
	if v := f["busy_tasks"]; v != nil && (lo.BusyTask <= 0 || lo.BusyTask > 1) {
		d.fail(v, path+".busy_tasks", "%g: want a share in (0, 1]", lo.BusyTask)
	}
	if v := f["confirm"]; v != nil {
		lo.Confirm, _ = d.integer(v, path+".confirm")
	}
	for _, x := range []boolField{{"off", &lo.Off}, {"no_park", &lo.NoPark}} {
		if v := f[x.key]; v != nil {
			*x.dst, _ = d.boolean(v, path+"."+x.key)
		}
	}
	if len(d.problems) == before {
		if err := lo.Validate(); err != nil {
			d.fail(n, path, "%v", err)
		}
	}
}

func (d *decoder) isolation(n *yaml.Node, path string) *IsolationPlan {
	p := &IsolationPlan{Line: n.Line}
	f := d.fields(n, path, "stack_cpus", "devices", "pids", "cgroups", "units", "ban_irqs", "backlog")
	if v := f["stack_cpus"]; v != nil {
		cpus, _ := d.cpus(v, path+".stack_cpus")
		p.Spec.StackCPUs = isolate.NewCPUSet(cpus...)
	} else if n.Kind == yaml.MappingNode {
		d.fail(n, path, "stack_cpus is required")
	}
	if v := f["devices"]; v != nil {
		for i, s := range d.strings(v, path+".devices") {
			ref, err := isolate.ParseDevice(s)
			if err != nil {
				d.fail(v.Content[i], fmt.Sprintf("%s.devices[%d]", path, i), "%v", err)
				continue
			}
			if ref.Netns != "" {
				if _, ok := d.resolve(v.Content[i], fmt.Sprintf("%s.devices[%d]", path, i), ref.Netns); !ok {
					continue
				}
			}
			p.Spec.Devices = append(p.Spec.Devices, ref)
		}
	}
	if v := f["pids"]; v != nil {
		for i, e := range d.list(v, path+".pids") {
			if pid, ok := d.integer(e, fmt.Sprintf("%s.pids[%d]", path, i)); ok {
				p.Spec.PIDs = append(p.Spec.PIDs, pid)
			}
		}
	}
	if v := f["cgroups"]; v != nil {
		p.Spec.Cgroups = d.strings(v, path+".cgroups")
	}
	if v := f["units"]; v != nil {
		p.Spec.Units = d.strings(v, path+".units")
	}
	if v := f["ban_irqs"]; v != nil {
		p.Spec.BanIRQs, _ = d.boolean(v, path+".ban_irqs")
	}
	if v := f["backlog"]; v != nil {
		if b, ok := d.integer(v, path+".backlog"); ok {
			if b < 0 {
				d.fail(v, path+".backlog", "%d: want 0 (unchanged) or more", b)
			}
			p.Spec.Backlog = b
		}
	}
	return p
}

// crossCheck finds conflicts between entries: a namespace listed twice
// (whatever its spelling), and a queue lane beside cpumap steering (both
// are XDP programs on the same underlay).
func (d *decoder) crossCheck(cfg *Config, f map[string]*yaml.Node) {
	seen := map[uint64]int{}
	for i, l := range cfg.Lanes {
		if l.NS.Ino == 0 {
			continue
		}
		if j, ok := seen[l.NS.Ino]; ok {
			o := cfg.Lanes[j]
			node := f["lanes"].Content[i]
			why := "one entry per namespace"
			if o.Mode != l.Mode {
				why = fmt.Sprintf("with mode %s there and %s here: a namespace has one lane", o.Mode, l.Mode)
			}
			d.fail(node, fmt.Sprintf("lanes[%d]", i), "%s is already listed at lanes[%d] (line %d) %s", l.NS, j, o.Line, why)
			continue
		}
		seen[l.NS.Ino] = i
	}
	steered := map[uint64]int{}
	for i, s := range cfg.Steering {
		if s.NS.Ino == 0 {
			continue
		}
		node := f["steering"].Content[i]
		if j, ok := steered[s.NS.Ino]; ok {
			d.fail(node, fmt.Sprintf("steering[%d]", i), "%s is already listed at steering[%d] (line %d): one entry per namespace", s.NS, j, cfg.Steering[j].Line)
			continue
		}
		steered[s.NS.Ino] = i
		if j, ok := seen[s.NS.Ino]; ok && s.Mode == SteerCpumap && cfg.Lanes[j].Mode == lanes.ModeQueue {
			d.fail(&yaml.Node{Line: s.ModeLine}, fmt.Sprintf("steering[%d].mode", i), "cpumap conflicts with the queue lane of lanes[%d] (line %d): both are XDP programs on the namespace's underlay; use mode sync there or steering mode dynamic", j, cfg.Lanes[j].Line)
		}
	}
}
