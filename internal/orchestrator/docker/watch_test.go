package docker

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/rxlane/rxlane/internal/workload"
)

// TestFromContainer maps labels to a workload: the lane, ports and
// protocol from the rxlane labels, the addresses sorted and once each;
// no labels is the default lane; labels that cannot be parsed are
// refused with workload.ErrInvalid.
func TestFromContainer(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.9.7"), netip.MustParseAddr("10.0.8.3")
	c := Container{ID: "c1", Name: "web", Running: true, Labels: map[string]string{
		"rxlane.lane": "high", "rxlane.ports": "5201, 8080-8090", "rxlane.proto": "tcp", "other": "x"}}
	w, err := FromContainer(c, []netip.Addr{a, b, a})
	if err != nil {
		t.Fatal(err)
	}
	want := workload.Workload{Source: workload.SourceDocker, ID: "c1", Name: "web", IPs: []netip.Addr{b, a}, Lane: "high", Ports: "5201, 8080-8090", Proto: "tcp"}
	if w.Source != want.Source || w.ID != want.ID || w.Name != want.Name || !slices.Equal(w.IPs, want.IPs) || w.Lane != want.Lane || w.Ports != want.Ports || w.Proto != want.Proto {
		t.Fatalf("got %+v\nwant %+v", w, want)
	}
	if rs, _ := w.Rules(); len(rs) != 4 {
		t.Fatalf("rules %v, want 2 addresses × 2 port ranges", rs)
	}

	w, err = FromContainer(Container{ID: "c2", Running: true}, []netip.Addr{a})
	if err != nil || w.InLane() {
		t.Fatalf("unlabelled: %+v, %v: want the default lane", w, err)
	}
	for _, labels := range []map[string]string{
		{"rxlane.lane": "turbo"},
		{"rxlane.ports": "7000"},
		{"rxlane.lane": "high", "rxlane.proto": "sctp"},
		{"rxlane.lane": "high", "rxlane.ports": "7000-6000"},
	} {
		if _, err := FromContainer(Container{ID: "c3", Labels: labels}, []netip.Addr{a}); !errors.Is(err, workload.ErrInvalid) {
			t.Errorf("labels %v: %v, want %v", labels, err, workload.ErrInvalid)
		}
	}
}

// TestCountsNetworksList: with a networks list, a network counts by its
// name, its ID or an ID prefix of 12 or more characters, whatever its
// driver (the daemon is not asked).
func TestCountsNetworksList(t *testing.T) {
	w := New(Options{Socket: "/nonexistent/docker.sock", Networks: []string{"web", "4f3a2b1c0d9e"}})
	id := "4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a"
	for _, tc := range []struct {
		name, id string
		want     bool
	}{
		{"web", "aaaa", true},
		{"db", id, true},
		{"db", "4f3a2b1c0d9f" + id[12:], false},
		{"db", "bbbb", false},
	} {
		if got := w.counts(context.Background(), tc.name, tc.id); got != tc.want {
			t.Errorf("counts(%s, %.12s) = %v, want %v", tc.name, tc.id, got, tc.want)
		}
	}
	if New(Options{Networks: []string{"4f3a2"}}).counts(context.Background(), "db", id) {
		t.Error("a 5-character ID prefix counts: too short to name one network")
	}
}

// TestEventContainerID: a container event's actor is the container; a
// network event names it in its attributes.
func TestEventContainerID(t *testing.T) {
	var e Event
	e.Type, e.Action, e.Actor.ID = "container", "start", "c1"
	if e.ContainerID() != "c1" {
		t.Fatal(e.ContainerID())
	}
	e.Type, e.Action, e.Actor.ID, e.Actor.Attributes = "network", "connect", "n1", map[string]string{"container": "c2"}
	if e.ContainerID() != "c2" {
		t.Fatal(e.ContainerID())
	}
}
