package trace

import (
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/rxlane/rxlane/internal/bpftest"
)

// TestLayoutMatchesC checks that every Go twin has the size and field
// offsets of its C struct, as compiled into the committed object.
func TestLayoutMatchesC(t *testing.T) {
	spec, err := loadNapiTrace()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c   string
		go_ any
	}{
		{"poll_event", pollEvent{}},
		{"dev_key", devKey{}},
		{"poll_count", pollCount{}},
		{"stage_key", stageKey{}},
		{"hist", hist{}},
		{"ev_key", evKey{}},
		{"dev_name", devName{}},
	} {
		t.Run(tc.c, func(t *testing.T) { bpftest.StructMatches(t, spec, tc.c, tc.go_) })
	}
}

// TestConstantsMatchC checks the enums Go mirrors.
func TestConstantsMatchC(t *testing.T) {
	spec, err := loadNapiTrace()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"EV_NONE": evNone, "EV_XMIT": evXmit, "EV_GRO": evGRO, "EV_NETIF_RX": evNetifRx,
		"EV_RECEIVE": evReceive, "EV_SOCK_COPY": evSockCopy, "EV_MAX": evMax,
		"ERR_RINGBUF_FULL": errRingbufFull, "ERR_INFLIGHT_UPDATE": errInflightUpdate,
		"ERR_HIST_UPDATE": errHistUpdate, "ERR_COUNTER_UPDATE": errCounterUpdate, "ERR_MAX": errMax,
	}
	got := bpftest.EnumValues(t, spec, "skb_event", "err_reason")
	bpftest.EnumsMatch(t, got, want)
	var h *btf.Struct
	if err := spec.Types.TypeByName("hist", &h); err != nil {
		t.Fatal(err)
	}
	if a, ok := h.Members[2].Type.(*btf.Array); !ok || a.Nelems != histBuckets {
		t.Errorf("hist.buckets is %v, want %d buckets", h.Members[2].Type, histBuckets)
	}
}
