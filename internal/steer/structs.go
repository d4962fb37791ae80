package steer

// MaxCPUs is the largest CPU set (STEER_MAX_CPUS).
const MaxCPUs = 64

// Flags of steerConfig (STEER_F_*) and steerDev (STEER_DEV_*).
const (
	flagOn           = 1 << 0
	flagDynamic      = 1 << 1
	flagExcludeFirst = 1 << 2
	devByMAC         = 1 << 0
)

// steerConfig is struct steer_cfg.
type steerConfig struct {
	NCPUs     uint32
	Threshold uint32 // permille
	Flags     uint32
	VxlanPort uint32
}

// steerCPU is struct steer_cpu.
type steerCPU struct {
	CPU  uint32
	Load uint32 // permille
}

// steerDev is struct steer_dev.
type steerDev struct {
	StageID uint32
	Flags   uint32
	Encap   uint32
	Pad     uint32
}

// endpointKey is struct steer_ep_key.
type endpointKey struct {
	MAC [6]byte
	Pad uint16
}

// flowKey is struct steer_flow_key.
type flowKey struct {
	FlowHash uint32
	StageID  uint32
}

// flowEntry is struct steer_flow.
type flowEntry struct {
	Packets uint64
	LastNs  uint64
	CPU     uint32
	Reason  uint32
	RPSHash uint32
	Pad     uint32
}

// permille converts a 0..1 load to the kernel's integer scale.
func permille(l float64) uint32 {
	return uint32(min(max(l, 0), 1)*1000 + 0.5)
}
