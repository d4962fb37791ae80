package steer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/labns"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// A test binary started with crashAtEnv set is a crash test's child: it
// runs Enable with the options in crashOptsEnv (a testbed made by the
// parent, whose state directory is crashTestbedEnv) and exits with status
// 3 right after journal record crashAtEnv is on disk, before the change it
// announces: a real kill, nothing deferred runs.
const (
	crashAtEnv      = "RXLANE_STEER_CRASH_AT"
	crashOptsEnv    = "RXLANE_STEER_CRASH_OPTS"
	crashTestbedEnv = "RXLANE_STEER_CRASH_TESTBED_DIR"
	crashExit       = 3
)

func TestMain(m *testing.M) {
	if at := os.Getenv(crashAtEnv); at != "" {
		os.Exit(crashChild(at))
	}
	os.Exit(m.Run())
}

func crashChild(at string) int {
	n, err := strconv.Atoi(at)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var o Options
	if err := json.Unmarshal([]byte(os.Getenv(crashOptsEnv)), &o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	labns.Dir = os.Getenv(crashTestbedEnv)
	journal.AfterRecord = func(_ string, seq int, _ string) {
		if seq == n {
			os.Exit(crashExit)
		}
	}
	if _, err := Enable(o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestEnableKilledAtEveryStep kills steer enable (a child process) right
// after each record of its journal, for every record from the begin to
// the commit, then runs disable and checks that every node of the testbed
// is as before enable (testbedtest.Snapshot: devices, XDP, qdiscs,
// filters, offloads, NAPI threading, rps_cpus) and the state file is gone.
// Before disable, status reports the interrupted enable and a second
// enable is refused. Two modes: both tc+RPS stages, and the same with the
// first stage on XDP and a cpumap and the sender's tx offload turned off,
// so every kind of change (filter, XDP, sender offload, rps_cpus) is cut
// at every point.
func TestEnableKilledAtEveryStep(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	tb := testbedtest.Up(t, testbedtest.Config(t))
	// A veth's default tx offload on the sending end, for --sender-tx-off
	// to turn off and disable to restore.
	if _, err := ethtool.SetIn(testbed.NetnsPath(tb, testbed.HostA), testbed.WireA, ethtool.TxCsum, true); err != nil {
		t.Fatal(err)
	}
	rx := listen(t, tb, testbed.CtrB, "198.19.0.2:7000")
	back := listen(t, tb, testbed.CtrA, "198.19.0.1:7002")
	sendSeq(t, rx, back, "198.19.0.1:7002", 1, 1) // brB learns ctrB's MAC (discovery)
	before := testbedtest.Snapshot(t, tb)
	base := Options{Netns: tb.NS(testbed.HostB), CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1}
	cpumap := base
	cpumap.FirstStage, cpumap.FirstCPUs, cpumap.SenderTxOff = FirstStageCpumap, []int{1}, true
	for _, mode := range []struct {
		name string
		o    Options
	}{{"stages", base}, {"cpumap", cpumap}} {
		t.Run(mode.name, func(t *testing.T) {
			kinds := map[string]bool{}
			for step := 0; ; step++ {
				state := filepath.Join(t.TempDir(), "steer.json")
				o := mode.o
				o.StateFile = state
				code, out := runCrashChild(t, o, step)
				if code != 0 && code != crashExit {
					t.Fatalf("step %d: enable exited %d: %s", step, code, out)
				}
				st, err := loadState(state)
				if err != nil || st == nil {
					t.Fatalf("step %d: state %+v, %v", step, st, err)
				}
				c, err := journal.Read(state)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range c.Intents {
					kinds[r.Kind] = true
				}
				// Killed at the commit record: committed, yet the
				// process died; before it: interrupted.
				if wantInterrupted := code == crashExit && !c.Committed; st.Interrupted != wantInterrupted {
					t.Errorf("step %d: interrupted=%v, want %v", step, st.Interrupted, wantInterrupted)
				}
				if st.Interrupted {
					s, err := ReadStatus(state)
					if err != nil || !s.Enabled || s.State == nil || !s.State.Interrupted {
						t.Errorf("step %d: status %+v, %v", step, s, err)
					}
				}
				if _, err := Enable(o); err == nil {
					t.Fatalf("step %d: enable over an existing state succeeded", step)
				}
				if err := Disable(state); err != nil {
					t.Fatalf("step %d: disable: %v", step, err)
				}
				if after := testbedtest.Snapshot(t, tb); after != before {
					t.Fatalf("step %d: testbed differs after disable:\nbefore:\n%s\nafter:\n%s", step, before, after)
				}
				if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("step %d: state file left after disable: %v", step, err)
				}
				if code == 0 { // enable completed: every step was cut
					t.Logf("%d steps (records %d intents + begin + commit), kinds %v", step, len(c.Intents), kinds)
					break
				}
			}
			want := []string{kindFilter, kindRPS}
			if mode.o.FirstStage != "" {
				want = append(want, kindXDP, kindSenderTx)
			}
			for _, k := range want {
				if !kinds[k] {
					t.Errorf("no %s change journaled", k)
				}
			}
		})
	}
}

// runCrashChild runs Enable(o) in a child process that exits after
// journal record step; it returns the exit status and output.
func runCrashChild(t *testing.T, o Options, step int) (int, string) {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), crashAtEnv+"="+strconv.Itoa(step), crashOptsEnv+"="+string(b), crashTestbedEnv+"="+labns.Dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}
