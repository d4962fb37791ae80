package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/rxlane/rxlane/internal/workload"
)

// prev is a bridge + host-local result: the bridge (no sandbox) with the
// gateway address, the host side of the veth, the container's eth0 with
// 10.7.0.5 and fd00:7::5.
const prev = `{"cniVersion":"1.0.0",
 "interfaces":[{"name":"cni0","mac":"02:00:00:00:00:01"},{"name":"veth1","mac":"02:00:00:00:00:02"},
  {"name":"eth0","mac":"02:00:00:00:00:03","sandbox":"/run/netns/ctr"}],
 "ips":[{"interface":2,"address":"10.7.0.5/24","gateway":"10.7.0.1"},
  {"interface":0,"address":"10.7.0.1/24"},
  {"interface":2,"address":"fd00:7::5/64"}],
 "routes":[{"dst":"0.0.0.0/0"}]}`

func conf(t *testing.T, extra string) []byte {
	t.Helper()
	s := `{"cniVersion":"1.0.0","name":"pods","type":"rxlane-cni"` + extra + `}`
	if !json.Valid([]byte(s)) {
		t.Fatalf("test config not JSON: %s", s)
	}
	return []byte(s)
}

func code(t *testing.T, err error) uint {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a CNI error", err, err)
	}
	return e.Code
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(conf(t, `,"prevResult":`+prev))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != DefaultSocket || c.StateDir != DefaultStateDir {
		t.Errorf("defaults: socket %q, stateDir %q", c.Socket, c.StateDir)
	}
	if got := c.PendingDir(); got != "/run/rxlane/agent/pending" {
		t.Errorf("pending dir %q", got)
	}
	addrs, iface, sandbox := ContainerAddrs(c.Result, "eth0")
	want := []netip.Addr{netip.MustParseAddr("10.7.0.5"), netip.MustParseAddr("fd00:7::5")}
	if len(addrs) != 2 || addrs[0] != want[0] || addrs[1] != want[1] {
		t.Errorf("container addresses %v, want %v (not the bridge's 10.7.0.1)", addrs, want)
	}
	if iface != "eth0" || sandbox != "/run/netns/ctr" {
		t.Errorf("interface %q in %q", iface, sandbox)
	}
	// An older spec's result is converted.
	c, err = ParseConfig([]byte(`{"cniVersion":"0.3.1","name":"pods","type":"rxlane-cni","prevResult":
		{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"version":"4","interface":0,"address":"10.7.0.9/24"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if a, _, _ := ContainerAddrs(c.Result, "eth0"); len(a) != 1 || a[0] != netip.MustParseAddr("10.7.0.9") {
		t.Errorf("0.3.1 prevResult addresses %v", a)
	}

	for _, e := range []struct {
		name  string
		stdin string
		code  uint
	}{
		{"not JSON", `{"name":`, types.ErrDecodingFailure},
		{"socket not a string", string(conf(t, `,"socket":5`)), types.ErrDecodingFailure},
		{"relative socket", string(conf(t, `,"socket":"agent.sock"`)), types.ErrInvalidNetworkConfig},
		{"relative stateDir", string(conf(t, `,"stateDir":"run"`)), types.ErrInvalidNetworkConfig},
		{"prevResult ips not a list", string(conf(t, `,"prevResult":{"cniVersion":"1.0.0","ips":{"a":1}}`)), types.ErrDecodingFailure},
		{"prevResult bad address", string(conf(t, `,"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.7.0.500/24"}]}`)), types.ErrDecodingFailure},
	} {
		_, err := ParseConfig([]byte(e.stdin))
		if err == nil {
			t.Errorf("%s: accepted", e.name)
			continue
		}
		if c := code(t, err); c != e.code {
			t.Errorf("%s: code %d (%v), want %d", e.name, c, err, e.code)
		}
	}
}

func TestRequest(t *testing.T) {
	args, err := ParseArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u1;RXLANE_LANE=high;RXLANE_PORTS=7000")
	if err != nil {
		t.Fatal(err)
	}
	if args.PodNamespace != "ns" || args.PodName != "web" || args.PodUID != "u1" || args.Lane != (LaneRequest{Lane: "high", Ports: "7000"}) {
		t.Fatalf("args %+v", args)
	}
	if _, err := ParseArgs("K8S_POD_NAME"); err == nil || code(t, err) != types.ErrInvalidEnvironmentVariables {
		t.Errorf("CNI_ARGS without '=': %v, want code 4", err)
	}

	rt := `,"runtimeConfig":{"rxlane":{"lane":"high","ports":"5201","proto":"udp"},
		"io.kubernetes.cri.pod-annotations":{"rxlane.io/lane":"high","rxlane.io/ports":"8080-8090"}}`
	for _, c := range []struct {
		name, extra string
		args        Args
		want        LaneRequest
		from        string
	}{
		{"runtimeConfig first", rt, args, LaneRequest{"high", "5201", "udp"}, "runtimeConfig.rxlane"},
		{"annotations next", `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"rxlane.io/lane":"high","rxlane.io/ports":"8080-8090","other":"x"}}`,
			args, LaneRequest{Lane: "high", Ports: "8080-8090"}, "pod annotations"},
		{"unrelated annotations: CNI_ARGS", `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"app":"web"}}`,
			args, LaneRequest{Lane: "high", Ports: "7000"}, "CNI_ARGS"},
		{"empty runtimeConfig entry", `,"runtimeConfig":{"rxlane":{}}`, Args{}, LaneRequest{}, ""},
		{"nothing", "", Args{}, LaneRequest{}, ""},
	} {
		cf, err := ParseConfig(conf(t, c.extra))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, from, err := Request(cf, c.args)
		if err != nil || got != c.want || from != c.from {
			t.Errorf("%s: %+v from %q (%v), want %+v from %q", c.name, got, from, err, c.want, c.from)
		}
	}
	for _, bad := range []string{`{"lane":7}`, `{"lane":"high","port":"80"}`, `"high"`} {
		cf, err := ParseConfig(conf(t, `,"runtimeConfig":{"rxlane":`+bad+`}`))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := Request(cf, Args{}); err == nil || code(t, err) != ErrInvalidLaneRequest {
			t.Errorf("runtimeConfig.rxlane %s: %v, want code %d", bad, err, ErrInvalidLaneRequest)
		}
	}
}

// buildPlugin builds cmd/rxlane-cni into a directory of the test and
// returns the directory (a CNI plugin path).
func buildPlugin(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(gobin, "build", "-o", filepath.Join(dir, "rxlane-cni"), "github.com/rxlane/rxlane/cmd/rxlane-cni")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build rxlane-cni: %v\n%s", err, out)
	}
	return dir
}

type run struct {
	stdout, stderr string
	exit           int
}

// runPlugin runs the binary as a runtime does: CNI_* variables, the
// configuration on stdin. CNI_NETNS_OVERRIDE skips skel's check that
// the namespace is not the plugin's own (no namespace is made here).
func runPlugin(t *testing.T, bin, command, args string, stdin []byte) run {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=ctr1", "CNI_NETNS=/run/netns/none",
		"CNI_IFNAME=eth0", "CNI_PATH=/nonexistent", "CNI_ARGS=" + args, "CNI_NETNS_OVERRIDE=1"}
	cmd.Stdin = bytes.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	r := run{stdout: o.String(), stderr: e.String()}
	var xe *exec.ExitError
	if errors.As(err, &xe) {
		r.exit = xe.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestBinary runs the built plugin without an agent (its socket in an
// empty directory): error JSON with the right codes on stdout and exit
// status 1 for input it cannot use; prevResult passed through unchanged;
// a lane request with no agent succeeds with a warning and a pending
// record, which a DEL replaces by a DEL record; VERSION.
func TestBinary(t *testing.T) {
	bin := filepath.Join(buildPlugin(t), "rxlane-cni")
	dir := t.TempDir()
	paths := `,"socket":"` + dir + `/agent.sock","stateDir":"` + dir + `"`
	withPrev := conf(t, paths+`,"prevResult":`+prev)
	laneRT := `,"runtimeConfig":{"rxlane":{"lane":"high","ports":"7000","proto":"udp"}}`

	for _, c := range []struct {
		name, command, args string
		stdin               []byte
		code                uint
	}{
		{"config not JSON", "ADD", "", []byte(`{"cniVersion":"1.0.0","name":`), types.ErrDecodingFailure},
		{"relative socket", "ADD", "", conf(t, `,"socket":"x.sock"`), types.ErrInvalidNetworkConfig},
		{"prevResult malformed", "ADD", "", conf(t, paths+`,"prevResult":{"cniVersion":"1.0.0","interfaces":"eth0"}`), types.ErrDecodingFailure},
		{"unknown lane", "ADD", "", conf(t, paths+`,"prevResult":`+prev+`,"runtimeConfig":{"rxlane":{"lane":"turbo"}}`), ErrInvalidLaneRequest},
		{"bad ports", "ADD", "RXLANE_LANE=high;RXLANE_PORTS=70000", withPrev, ErrInvalidLaneRequest},
		{"ports without a lane", "ADD", "RXLANE_PORTS=7000", withPrev, ErrInvalidLaneRequest},
		{"lane without prevResult", "ADD", "", conf(t, paths+laneRT), ErrNoAddresses},
		{"CNI_ARGS malformed", "ADD", "K8S_POD_NAME", withPrev, types.ErrInvalidEnvironmentVariables},
		{"CHECK without prevResult", "CHECK", "", conf(t, paths), types.ErrInvalidNetworkConfig},
		{"DEL config not JSON", "DEL", "", []byte(`{`), types.ErrDecodingFailure},
		{"STATUS before 1.1.0", "STATUS", "", conf(t, paths), types.ErrIncompatibleCNIVersion},
	} {
		r := runPlugin(t, bin, c.command, c.args, c.stdin)
		var e types.Error
		if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || r.exit != 1 || e.Code != c.code || e.Msg == "" {
			t.Errorf("%s: exit %d, stdout %q (%v), want exit 1 and error JSON with code %d", c.name, r.exit, r.stdout, err, c.code)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "agent", "pending")); len(ents) != 0 {
		t.Fatalf("failed commands left pending records: %v", ents)
	}

	// A plain container: prevResult through, nothing else.
	r := runPlugin(t, bin, "ADD", "", withPrev)
	if r.exit != 0 || !sameJSON(t, r.stdout, prev) || r.stderr != "" {
		t.Fatalf("plain ADD: exit %d, stdout %s, stderr %q; want prevResult unchanged, no warning", r.exit, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "agent")); !os.IsNotExist(err) {
		t.Fatalf("plain ADD made the agent's directory: %v", err)
	}
	// A lane request with no agent: success, warning, pending record.
	r = runPlugin(t, bin, "ADD", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web", conf(t, paths+laneRT+`,"prevResult":`+prev))
	if r.exit != 0 || !sameJSON(t, r.stdout, prev) || !strings.Contains(r.stderr, "no agent answers") {
		t.Fatalf("ADD with no agent: exit %d, stdout %s, stderr %q", r.exit, r.stdout, r.stderr)
	}
	recs, errs := workload.TakePending(filepath.Join(dir, "agent", "pending"))
	want := workload.Workload{Source: workload.SourceCNI, ID: "ctr1/eth0", Name: "ns/web", Lane: "high", Ports: "7000", Proto: "udp",
		IPs: []netip.Addr{netip.MustParseAddr("10.7.0.5"), netip.MustParseAddr("fd00:7::5")}}
	if len(errs) != 0 || len(recs) != 1 || recs[0].Op != workload.OpSet || !sameWorkload(recs[0].Workload, want) {
		t.Fatalf("pending after ADD: %+v %v, want one set of %+v", recs, errs, want)
	}
	workload.Done(recs[0].Path)
	// DEL with no agent, twice: success, a DEL record.
	for range 2 {
		r = runPlugin(t, bin, "DEL", "", conf(t, paths))
		if r.exit != 0 || r.stdout != "" {
			t.Fatalf("DEL with no agent: exit %d, stdout %q", r.exit, r.stdout)
		}
	}
	recs, errs = workload.TakePending(filepath.Join(dir, "agent", "pending"))
	if len(errs) != 0 || len(recs) != 1 || recs[0].Op != workload.OpDel || recs[0].Workload.Key() != want.Key() {
		t.Fatalf("pending after DEL: %+v %v, want one del of %s", recs, errs, want.Key())
	}
	// STATUS succeeds with no agent (1.1.0).
	if r := runPlugin(t, bin, "STATUS", "", []byte(`{"cniVersion":"1.1.0","name":"pods","type":"rxlane-cni"}`)); r.exit != 0 {
		t.Errorf("STATUS: exit %d, %s", r.exit, r.stdout)
	}
	// VERSION lists every spec version through 1.1.0.
	r = runPlugin(t, bin, "VERSION", "", []byte(`{"cniVersion":"1.1.0"}`))
	if r.exit != 0 || !strings.Contains(r.stdout, `"1.1.0"`) || !strings.Contains(r.stdout, `"0.4.0"`) {
		t.Errorf("VERSION: %d %s", r.exit, r.stdout)
	}
	// By hand: help on stdout, exit 0.
	out, err := exec.Command(bin, "--help").Output()
	if err != nil || !strings.Contains(string(out), "runtimeConfig.rxlane") {
		t.Errorf("--help: %v\n%s", err, out)
	}
}

func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

func sameWorkload(a, b workload.Workload) bool {
	ab, _ := json.Marshal(a)
	bb, _ := json.Marshal(b)
	return bytes.Equal(ab, bb)
}

// TestHungAgent: an agent that accepts the connection and never answers
// holds ADD for the plugin's timeout only; the container starts and a
// pending record is left, as with no agent.
func TestHungAgent(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	var out, errOut bytes.Buffer
	p := &Plugin{Stdout: &out, Stderr: &errOut, Timeout: 200 * time.Millisecond}
	stdin := conf(t, `,"socket":"`+sock+`","stateDir":"`+dir+`","prevResult":`+prev+`,"runtimeConfig":{"rxlane":{"lane":"high"}}`)
	if err := p.Add(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", StdinData: stdin}); err != nil {
		t.Fatalf("ADD with a hung agent: %v", err)
	}
	if !sameJSON(t, out.String(), prev) || !strings.Contains(errOut.String(), "did not answer within 200ms") {
		t.Fatalf("ADD with a hung agent: stdout %s, stderr %q", out.String(), errOut.String())
	}
	recs, errs := workload.TakePending(filepath.Join(dir, "agent", "pending"))
	if len(errs) != 0 || len(recs) != 1 || recs[0].Op != workload.OpSet || recs[0].Workload.ID != "c1/eth0" {
		t.Fatalf("pending records %+v %v, want the set of c1/eth0", recs, errs)
	}
}
