package testbedtest

import (
	"errors"
	"os"
	"testing"

	"github.com/rxlane/rxlane/internal/netns"
)

// BridgeNetfilterOff turns br_netfilter's iptables calls off in the
// test's namespace ns (a lane that takes workloads skips no filter, and
// br_netfilter, when loaded, filters bridged traffic in every namespace;
// nothing to do when it is not loaded).
func BridgeNetfilterOff(t testing.TB, ns string) {
	t.Helper()
	err := netns.Do(ns, false, func() error {
		for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
			p := "/proc/sys/net/bridge/" + k
			if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err := os.WriteFile(p, []byte("0"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
