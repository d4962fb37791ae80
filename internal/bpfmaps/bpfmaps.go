// Package bpfmaps opens the maps of a BPF program already in the kernel
// (found through its tc filter or XDP attachment) into the bpf2go maps
// struct of its object, by map name, so that commands run after the one
// that loaded it (status, sync, disable, loads) reach the same maps.
package bpfmaps

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
)

// Open sets every *ebpf.Map field of dst (a pointer to a bpf2go maps
// struct, whose fields carry `ebpf:"name"` tags) to prog's map of that
// name. Fields whose map prog does not hold stay nil: the caller decides
// which it requires. prog's other maps are closed. On error, dst may hold
// maps already opened: close it.
func Open(prog *ebpf.Program, dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("bpfmaps: want a pointer to a maps struct, got %T", dst)
	}
	fields := map[string]reflect.Value{}
	st := v.Elem()
	mapType := reflect.TypeFor[*ebpf.Map]()
	for i := range st.NumField() {
		if f := st.Type().Field(i); f.Type == mapType && f.Tag.Get("ebpf") != "" {
			fields[f.Tag.Get("ebpf")] = st.Field(i)
		}
	}
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("program info: %w", err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return errors.New("program info has no map IDs")
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			return fmt.Errorf("open map %d: %w", id, err)
		}
		mi, err := m.Info()
		if err != nil {
			m.Close()
			return fmt.Errorf("map %d info: %w", id, err)
		}
		if f, ok := fields[mi.Name]; ok && f.IsNil() {
			f.Set(reflect.ValueOf(m))
		} else {
			m.Close()
		}
	}
	return nil
}
