package trace

import (
	"reflect"
	"testing"

	"github.com/cilium/ebpf/btf"
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
		t.Run(tc.c, func(t *testing.T) {
			var s *btf.Struct
			if err := spec.Types.TypeByName(tc.c, &s); err != nil {
				t.Fatalf("find struct %s in BTF: %v", tc.c, err)
			}
			gt := reflect.TypeOf(tc.go_)
			if uintptr(s.Size) != gt.Size() {
				t.Fatalf("struct %s is %d bytes, Go %s is %d", tc.c, s.Size, gt.Name(), gt.Size())
			}
			if len(s.Members) != gt.NumField() {
				t.Fatalf("struct %s has %d fields, Go %s has %d", tc.c, len(s.Members), gt.Name(), gt.NumField())
			}
			for i, m := range s.Members {
				f := gt.Field(i)
				size, err := btf.Sizeof(m.Type)
				if err != nil {
					t.Fatal(err)
				}
				if uintptr(m.Offset.Bytes()) != f.Offset || uintptr(size) != f.Type.Size() {
					t.Errorf("%s.%s at %d (%d bytes), Go %s.%s at %d (%d bytes)",
						tc.c, m.Name, m.Offset.Bytes(), size, gt.Name(), f.Name, f.Offset, f.Type.Size())
				}
			}
		})
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
	got := map[string]int{}
	for _, name := range []string{"skb_event", "err_reason"} {
		var e *btf.Enum
		if err := spec.Types.TypeByName(name, &e); err != nil {
			t.Fatalf("find enum %s in BTF: %v", name, err)
		}
		for _, v := range e.Values {
			got[v.Name] = int(v.Value)
		}
	}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s: C %d (present %v), Go %d", name, g, ok, v)
		}
	}
	var h *btf.Struct
	if err := spec.Types.TypeByName("hist", &h); err != nil {
		t.Fatal(err)
	}
	if a, ok := h.Members[2].Type.(*btf.Array); !ok || a.Nelems != histBuckets {
		t.Errorf("hist.buckets is %v, want %d buckets", h.Members[2].Type, histBuckets)
	}
}
