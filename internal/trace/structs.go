package trace

// Go twins of the structures bpf/include/napi_trace.h shares with Go.
// TestLayoutMatchesC checks every pair's size and field offsets against the
// BTF of the compiled object; keep the field order of the C struct.

const ifNameSize = 16

// pollEvent is the Go twin of struct poll_event.
type pollEvent struct {
	TsNs      uint64
	Seq       uint64
	Softirq   uint64
	CPU       uint32
	Iteration uint32
	Ifindex   uint32
	Netns     uint32
	Work      int32
	Budget    int32
	Dev       [ifNameSize]byte
}

// devKey is the Go twin of struct dev_key.
type devKey struct {
	Name    [ifNameSize]byte
	Ifindex uint32
	Netns   uint32
}

// pollCount is the Go twin of struct poll_count.
type pollCount struct {
	Polls uint64
	Work  uint64
	Full  uint64
}

// stageKey is the Go twin of struct stage_key.
type stageKey struct {
	FromEv  uint8
	ToEv    uint8
	Pad     uint16
	FromDev [ifNameSize]byte
	ToDev   [ifNameSize]byte
}

// histBuckets is HIST_BUCKETS.
const histBuckets = 40

// hist is the Go twin of struct hist.
type hist struct {
	Count   uint64
	SumNs   uint64
	Buckets [histBuckets]uint64
}

// evKey is the Go twin of struct ev_key.
type evKey struct {
	Ev    uint8
	Pad   [3]uint8
	Netns uint32
	Dev   [ifNameSize]byte
}

// devName is the Go twin of struct dev_name.
type devName struct {
	Name [ifNameSize]byte
}

// Packet events, the Go twin of enum skb_event.
const (
	evNone     = 0
	evXmit     = 1
	evGRO      = 2
	evNetifRx  = 3
	evReceive  = 4
	evSockCopy = 5
	evMax      = 6
)

// Error reasons, the Go twin of enum err_reason.
const (
	errRingbufFull    = 0
	errInflightUpdate = 1
	errHistUpdate     = 2
	errCounterUpdate  = 3
	errMax            = 4
)

// Softirq vectors (include/linux/interrupt.h).
const (
	softirqNetTx = 2
	softirqNetRx = 3
	nrSoftirqs   = 10
)

// Event names used in reports, indexed by skb_event.
var eventNames = [evMax]string{
	evNone:     "none",
	evXmit:     "xmit",
	evGRO:      "gro",
	evNetifRx:  "netif_rx",
	evReceive:  "receive",
	evSockCopy: "sock_copy",
}

// eventName returns the report name of a packet event.
func eventName(ev uint8) string {
	if int(ev) < len(eventNames) {
		return eventNames[ev]
	}
	return "unknown"
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func devNameKey(name string) devName {
	var k devName
	copy(k.Name[:ifNameSize-1], name)
	return k
}
