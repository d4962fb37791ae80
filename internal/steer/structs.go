package steer

// MaxCPUs is the largest CPU set (STEER_MAX_CPUS).
const MaxCPUs = 64

// Flags of steerConfig (STEER_F_*) and steerDev (STEER_DEV_*).
const (
	flagOn           = 1 << 0
	flagDynamic      = 1 << 1
	flagExcludeFirst = 1 << 2
	flagNoGuard      = 1 << 3
	flagFirstOn      = 1 << 4
	flagLocal        = 1 << 5
	devByMAC         = 1 << 0
	devEntry         = 1 << 1
	devOff           = 1 << 2
	devByIP          = 1 << 3
	devChainMAC      = 1 << 4
	devChainIP       = 1 << 5
	// devKeyWire marks an underlay's key in steer_devs (steer_entry's
	// devices): its ifindex may equal the VXLAN device's in another
	// namespace (STEER_DEV_KEY_WIRE).
	devKeyWire = 1 << 31
	// stageXDP marks the XDP stage's flow key (STEER_STAGE_XDP | ifindex).
	stageXDP = 1 << 31
	// stageCtr marks a container device's stage (STEER_STAGE_CTR).
	stageCtr = 1 << 30
	// committedDirect is flowEntry.Committed of a tc stage that is off
	// (STEER_DIRECT): hash 0, the next device's RPS skipped.
	committedDirect = 0xfffe
)

// steerConfig is struct steer_cfg.
type steerConfig struct {
	NCPUs     uint32
	Threshold uint32 // permille
	Flags     uint32
	// IdleMs: a flow-stage idle this long may switch CPU even if its
	// packets were never seen delivered; 0: never.
	IdleMs uint32
	NFirst uint32 // first-stage (XDP cpumap) CPUs
	// SettleNs: the last delivery must be this old before a switch.
	SettleNs uint32
}

// settleNs gives the old CPU time to finish the IP and socket layers of
// the last packet the done hook saw before another CPU may overtake it.
const settleNs = 200000

// steerCpumapVal is struct steer_cpumap_val (struct bpf_cpumap_val).
type steerCpumapVal struct {
	Qsize  uint32
	ProgFD uint32
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
	// NextStageID: with devChain*, the next device's StageID.
	NextStageID uint32
}

// tunnelKey is struct steer_tunnel_key: how the entry tells an
// encapsulated packet's VXLAN device (outer family 4 or 6, UDP port, VNI).
type tunnelKey struct {
	VNI    uint32
	Port   uint16
	Family uint8
	Pad    uint8
}

// endpointKey is struct steer_ep_key.
type endpointKey struct {
	MAC [6]byte
	Pad uint16
}

// endpointIPKey is struct steer_ip_key: an inner destination address
// (IPv4 v4-mapped), the key of routed endpoints.
type endpointIPKey struct {
	Addr [16]byte
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
	LastNs      uint64
	DoneNs      uint64
	NextSeq     uint32
	DoneSeq     uint32
	XDPFrames   uint32
	EntryFrames uint32
	DoneCPU     uint32
	// DirectIn, DirectOut: packets the entry sent direct (hash 0, no
	// number) and those of them the done hook saw; Direct: the entry
	// sends the flow direct now.
	DirectIn  uint32
	DirectOut uint32
	Direct    uint32
}

// permille converts a 0..1 load to the kernel's integer scale.
func permille(l float64) uint32 {
	return uint32(min(max(l, 0), 1)*1000 + 0.5)
}
