// Package bpftest holds checks shared by the tests of the packages that
// load BPF objects: every Go struct that mirrors a C struct must have its
// size and field offsets, and every Go constant that mirrors a C enum its
// value, as compiled into the committed object's BTF.
package bpftest

import (
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// StructMatches fails t unless goValue's type has the size, field count,
// and per-field offset and size of the C struct cName in spec.
func StructMatches(t *testing.T, spec *ebpf.CollectionSpec, cName string, goValue any) {
	t.Helper()
	var s *btf.Struct
	if err := spec.Types.TypeByName(cName, &s); err != nil {
		t.Fatalf("find struct %s in BTF: %v", cName, err)
	}
	gt := reflect.TypeOf(goValue)
	if uintptr(s.Size) != gt.Size() {
		t.Fatalf("struct %s is %d bytes, Go %s is %d", cName, s.Size, gt.Name(), gt.Size())
	}
	if len(s.Members) != gt.NumField() {
		t.Fatalf("struct %s has %d fields, Go %s has %d", cName, len(s.Members), gt.Name(), gt.NumField())
	}
	for i, m := range s.Members {
		f := gt.Field(i)
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatal(err)
		}
		if uintptr(m.Offset.Bytes()) != f.Offset || uintptr(size) != f.Type.Size() {
			t.Errorf("%s.%s at %d (%d bytes), Go %s.%s at %d (%d bytes)",
				cName, m.Name, m.Offset.Bytes(), size, gt.Name(), f.Name, f.Offset, f.Type.Size())
		}
	}
}

// EnumValues returns the values of the named C enums in spec, by name.
func EnumValues(t *testing.T, spec *ebpf.CollectionSpec, enums ...string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, name := range enums {
		var e *btf.Enum
		if err := spec.Types.TypeByName(name, &e); err != nil {
			t.Fatalf("find enum %s in BTF: %v", name, err)
		}
		for _, v := range e.Values {
			got[v.Name] = int(v.Value)
		}
	}
	return got
}

// EnumsMatch fails t for every name in want whose C value in got is
// missing or different.
func EnumsMatch(t *testing.T, got, want map[string]int) {
	t.Helper()
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s: C %d (present %v), Go %d", name, g, ok, v)
		}
	}
}
