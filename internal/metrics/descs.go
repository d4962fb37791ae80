package metrics

import "github.com/prometheus/client_golang/prometheus"

// The datapath's metrics, made at scrape time (docs/metrics.md).
var (
	descSourceUp = desc("rxlane_source_up",
		"1 if the source (lanes, steer or isolate of a namespace) was read in this scrape, 0 if it failed.",
		"source", "netns")

	// Lanes (lanes.Store.Stats).
	descLaneEnabled = desc("rxlane_lane_enabled",
		"1 if rxlane's lane is attached in the namespace (also one found without a record), 0 if not.",
		"netns")
	descLaneInfo = desc("rxlane_lane_info",
		"Always 1 for an enabled lane; the labels are its mode (sync, queue), --skip-netfilter and whether rxlane has a record of it.",
		"netns", "mode", "skip_netfilter", "recorded")
	descLanePackets = desc("rxlane_lane_packets_total",
		"Packets the lane's program classified: lane high was served by the lane, lane low took the normal path.",
		"netns", "lane")
	descLaneBytes = desc("rxlane_lane_bytes_total",
		"Bytes (outer frame) of the packets counted in rxlane_lane_packets_total.",
		"netns", "lane")
	descRulePackets = desc("rxlane_lane_rule_packets_total",
		"Packets that matched the high-priority rule (by rule id).",
		"netns", "rule")
	descRuleBytes = desc("rxlane_lane_rule_bytes_total",
		"Bytes (outer frame) of the packets that matched the rule.",
		"netns", "rule")
	descRuleRedirectFail = desc("rxlane_lane_redirect_failures_total",
		"Packets that matched the rule but whose redirect to the endpoint failed (they took the normal path).",
		"netns", "rule")
	descRuleInfo = desc("rxlane_lane_rule_info",
		"Always 1; match is the rule as `lanes list` prints it.",
		"netns", "rule", "match")
	descFallbacks = desc("rxlane_lane_fallbacks_total",
		"Packets that took the normal path, by reason (no_match, no_endpoint, outer_csum, ...).",
		"netns", "reason")
	descLaneWarnings = desc("rxlane_lane_warnings",
		"Warnings `lanes stats` prints for the lane (counters saying it is not serving what its rules match); 0 when all is well.",
		"netns")

	// Steering (steer.ReadStatus).
	descSteerEnabled = desc("rxlane_steer_enabled",
		"1 if steering is enabled in the namespace, 0 if not.",
		"netns")
	descSteerOn = desc("rxlane_steer_on",
		"1 while the datapath steers (the CPU set's average load is below the global threshold and the placement is steered), 0 while every flow goes direct.",
		"netns")
	descSteerSteered = desc("rxlane_steer_placement_steered",
		"The closed loop's placement for good: 1 steered, 0 off (unsteered); 1 when no loop ran.",
		"netns")
	descSteerParked = desc("rxlane_steer_parked",
		"1 while the loop has the datapath parked (placement off, programs returning at once, the node's own RPS).",
		"netns")
	descSteerTrial = desc("rxlane_steer_trial",
		"1 while the loop measures the other placement in a trial.",
		"netns")
	descSteerPackets = desc("rxlane_steer_packets_total",
		"Packets by the reason their next stage went where it went (first, second, off, static, no_flow, no_dev, local).",
		"netns", "reason")
	descSteerDeferred = desc("rxlane_steer_guard_deferred_total",
		"Changes of CPU the in-flight guard deferred (the flow still had packets in flight on the old CPU).",
		"netns")
	descSteerSwitches = desc("rxlane_steer_cpu_switches_total",
		"Changes of a flow-stage's CPU committed by the datapath.",
		"netns")
	descSteerDelivered = desc("rxlane_steer_delivered_packets_total",
		"Packets the done hook saw delivered to a container.",
		"netns")
	descSteerCPULoad = desc("rxlane_steer_cpu_load_ratio",
		"Load of a CPU of the steering set as published to the datapath (0..1).",
		"netns", "cpu")
	descSteerAvgLoad = desc("rxlane_steer_avg_load_ratio",
		"Mean published load of the steering set (0..1).",
		"netns")
	descSteerStageFlows = desc("rxlane_steer_stage_flows",
		"Active flows (a packet within 1 s) of a stage by the CPU that runs it: where steering placed the stages.",
		"netns", "stage", "cpu")
	descLoopDecisions = desc("rxlane_steer_loop_decisions_total",
		"The closed loop's decisions by reason (better, better_unconfirmed, kept, no_spare_cpu, idle, unsteady).",
		"netns", "reason")
	descLoopSwitches = desc("rxlane_steer_loop_switches_total",
		"Placement switches for good the closed loop made.",
		"netns")

	// Isolation (isolate.System.Status).
	descIsolateApplied = desc("rxlane_isolate_applied",
		"1 if an isolation is applied (journaled), 0 if not.")
	descIsolateCommitted = desc("rxlane_isolate_committed",
		"1 if the applied isolation's apply completed, 0 if it was interrupted (revert it).")
	descIsolateDrift = desc("rxlane_isolate_drift",
		"Per applied setting: 1 if its value is no longer what rxlane set (changed behind rxlane's back), 0 if it is.",
		"kind", "object", "netns")
	descIsolateDrifted = desc("rxlane_isolate_drifted_settings",
		"Applied settings whose value is no longer what rxlane set.")
	descIsolateGone = desc("rxlane_isolate_gone_settings",
		"Applied settings whose object is gone (a thread exited, a device removed).")

	// Workloads (the agent's orchestrator requests).
	descWorkloads = desc("rxlane_workloads",
		"Workloads the agent holds, by source (cni, kubernetes, docker) and whether they asked for the high-priority lane (in_lane).",
		"source", "in_lane")
)

var metricDescs = []*prometheus.Desc{
	descSourceUp,
	descLaneEnabled, descLaneInfo, descLanePackets, descLaneBytes, descRulePackets, descRuleBytes,
	descRuleRedirectFail, descRuleInfo, descFallbacks, descLaneWarnings,
	descSteerEnabled, descSteerOn, descSteerSteered, descSteerParked, descSteerTrial, descSteerPackets,
	descSteerDeferred, descSteerSwitches, descSteerDelivered, descSteerCPULoad, descSteerAvgLoad,
	descSteerStageFlows, descLoopDecisions, descLoopSwitches,
	descIsolateApplied, descIsolateCommitted, descIsolateDrift, descIsolateDrifted, descIsolateGone,
	descWorkloads,
}
