// Package bench is the load and measurement of rxlane's benchmarks: the
// agents that run in testbed nodes (prober and echo server, injector of
// ready-made frames, sinks, TCP flood), pacing, scheduling, host counters,
// latency summaries, the report header, tables and plots, and the two
// plain benchmarks built on them, Latency (`rxlane bench latency`) and
// Throughput (`rxlane bench throughput`). The per-feature experiments
// (lanes, steering, isolation) are in package experiments.
package bench
