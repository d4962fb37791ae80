package steer

// MaxCPUs is the largest CPU set (STEER_MAX_CPUS).
const MaxCPUs = 64

// Flags of steerConfig (STEER_F_*) and steerDev (STEER_DEV_*).
const (
	flagOn           = 1 << 0
	flagDynamic      = 1 << 1
	flagExcludeFirst = 1 << 2
	flagNoGuard      = 1 << 3
	devByMAC         = 1 << 0
	devEntry         = 1 << 1
)

// steerConfig is struct steer_cfg.
type steerConfig struct {
	NCPUs     uint32
	Threshold uint32 // permille
	Flags     uint32
	VxlanPort uint32
	// IdleMs: a flow-stage idle this long may switch CPU even if its
	// packets were never seen delivered; 0: never.
	IdleMs uint32
	Pad    uint32
}

// idleMs is the idle time after which a flow whose delivery the guard
// cannot see may switch CPU (a packet queued that long is assumed gone).
const idleMs = 500

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
	Packets   uint64
	LastNs    uint64
	First     uint64
	Second    uint64
	Off       uint64
	Deferred  uint64
	Switches  uint64
	CPU       uint32
	Reason    uint32
	RPSHash   uint32
	Committed uint32
	WantCPU   uint32
	Pad       uint32
}

// guardEntry is struct steer_guard.
type guardEntry struct {
	LastNs  uint64
	DoneNs  uint64
	NextSeq uint32
	DoneSeq uint32
}

// permille converts a 0..1 load to the kernel's integer scale.
func permille(l float64) uint32 {
	return uint32(min(max(l, 0), 1)*1000 + 0.5)
}
