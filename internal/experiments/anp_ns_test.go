package experiments

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rxlane/rxlane/internal/bench"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestANPRunIsUndone runs the ANP benchmark once, tiny, on a fresh shared
// testbed: every mode produces samples, and afterwards the overlay
// devices' rps_cpus/xps_cpus are as before, the cgroups are gone and no
// isolation journal is left. It asserts nothing about timing.
func TestANPRunIsUndone(t *testing.T) {
	cfg := testbedtest.Config(t)
	cfg.Layout = testbed.LayoutShared
	tb := testbedtest.Up(t, cfg)
	if _, err := os.Stat(filepath.Join(cpusetRoot, "cpuset.cpus")); err != nil {
		t.Skipf("skipping: no cgroup v1 cpuset hierarchy (%v)", err)
	}
	exps := []string{ANPPingPong}
	if _, err := exec.LookPath("redis-server"); err == nil {
		if _, err := exec.LookPath("redis-benchmark"); err == nil {
			exps = append(exps, ANPRedis)
		}
	}
	if len(exps) == 1 {
		t.Log("redis-server/redis-benchmark not installed (scripts/setup): redis part skipped")
	}
	queues := func() string {
		var out []string
		for _, n := range []testbed.Node{testbed.HostA, testbed.HostB, testbed.CtrA, testbed.CtrB} {
			if err := testbed.DoSysfs(tb, n, func() error {
				fs, _ := filepath.Glob("/sys/class/net/*/queues/*/[rx]ps_cpus")
				for _, f := range fs {
					b, _ := os.ReadFile(f)
					out = append(out, string(n)+f+"="+strings.TrimSpace(string(b)))
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		return strings.Join(out, "\n")
	}
	before := queues()
	o := ANPOptions{
		Latency: bench.LatencyOptions{Testbed: tb, Reps: 1, Duration: 300 * time.Millisecond, Warmup: 50 * time.Millisecond,
			Proto: "udp", Prober: "rxlane", Rate: 500, Size: 64, BgRate: 2000, BgSize: 64, BgFlows: 1, BgProto: "udp"},
		Experiments:   exps,
		RedisRequests: 2000, RedisClients: 2, RedisPipeline: 4, RedisValue: 64, RedisKeys: 100,
	}
	rep, err := ANP(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.PingPong) != 3 {
		t.Fatalf("ping-pong cases %+v", rep.PingPong)
	}
	for _, c := range rep.PingPong {
		if len(c.Reps) != 1 || c.Reps[0].Latency.Count == 0 {
			t.Errorf("%s: no ping-pong samples: %+v", c.Mode, c.Reps)
		}
	}
	for _, c := range rep.Redis {
		if len(c.Reps) != 1 || len(c.Stats) != 2 || c.Stats[0].RPS.Median <= 0 {
			t.Errorf("%s: redis results %+v", c.Mode, c)
		}
	}
	if after := queues(); after != before {
		t.Errorf("queues changed by the run:\nbefore\n%s\nafter\n%s", before, after)
	}
	for _, cg := range rep.Cgroups {
		if _, err := os.Stat(filepath.Join(cpusetRoot, cg)); err == nil {
			t.Errorf("cgroup %s left behind", cg)
		}
	}
	if ls, _ := filepath.Glob(filepath.Join(os.TempDir(), "rxlane-anp-*", "journal.jsonl")); len(ls) > 0 {
		t.Errorf("isolation journal left: %v", ls)
	}
}
