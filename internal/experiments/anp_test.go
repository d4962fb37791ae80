package experiments

import (
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/bench"
)

func TestParseRedisCSV(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","900900.88","0.575","0.136","0.543","0.823","1.271","3.071"
"GET","902934.56","0.474","0.112","0.463","0.583","0.727","1.767"
`
	rs, err := ParseRedisCSV(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Test != "SET" || rs[0].RPS != 900900.88 || rs[0].P50Ms != 0.543 || rs[0].P99Ms != 1.271 ||
		rs[1].Test != "GET" || rs[1].AvgMs != 0.474 || rs[1].P95Ms != 0.583 || rs[1].MaxMs != 1.767 {
		t.Fatalf("%+v", rs)
	}
	if _, err := ParseRedisCSV("Could not connect to Redis at 198.19.0.2:6379: Connection refused\n"); err == nil {
		t.Fatal("no error for output without results")
	}
}

func TestANPOptionsValidate(t *testing.T) {
	good := ANPOptions{
		Latency: bench.LatencyOptions{Reps: 1, Duration: 1e9, Proto: "udp", Prober: "rxlane", Rate: 1000, Size: 64,
			BgRate: 1000, BgSize: 64, BgFlows: 1, BgProto: "udp"},
		Experiments: []string{ANPPingPong, ANPRedis}, Modes: []string{ANPShared, ANPIsolated},
		RedisRequests: 1000, RedisClients: 1, RedisPipeline: 1, RedisValue: 1, RedisKeys: 1,
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mod  func(*ANPOptions)
		want string
	}{
		{func(o *ANPOptions) { o.Experiments = []string{"memtier"} }, "unknown experiment"},
		{func(o *ANPOptions) { o.Experiments = nil }, "experiments"},
		{func(o *ANPOptions) { o.Modes = []string{"asym"} }, "unknown mode"},
		{func(o *ANPOptions) { o.RedisRequests = 10 }, "redis-requests"},
		{func(o *ANPOptions) { o.RedisPipeline = 0 }, "redis-pipeline"},
		{func(o *ANPOptions) { o.Latency.Reps = 0 }, "reps"},
		{func(o *ANPOptions) { o.Latency.Proto = "tcp" }, "UDP prober"},
	} {
		o := good
		tc.mod(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want error about %q, got %v", tc.want, err)
		}
	}
}
