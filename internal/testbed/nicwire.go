package testbed

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/rxlane/rxlane/internal/netns"
)

// NICWire arranges a veth wire between a sender and a receiving node
// that rxlane did not build (a Flannel, Calico or Docker node from
// package nodes) as the nic layout arranges the testbed's: the sender's
// end (peerNS, peerDev) computes checksums and sends unsegmented frames
// (tx checksum offload and TSO off, as a NIC sender puts real checksums
// on the wire), the receiving end (ns, dev) has GRO on (so veth polls its
// own NAPI ring, whose GRO verifies the checksums as a NIC's receive
// offload does), threaded NAPI with the kthread pinned to cpu at
// SCHED_FIFO NAPIRTPrio, and no RPS. The namespaces are files; the node
// is expected to be thrown away after use, so nothing is restored.
func NICWire(ns, dev, peerNS, peerDev string, cpu int) error {
	err := netns.Do(peerNS, false, func() error {
		if err := setOffload(peerDev, OffloadTXCsum, false); err != nil {
			return err
		}
		return setOffload(peerDev, OffloadTSO, false)
	})
	if err != nil {
		return fmt.Errorf("sender's end %s: %w", peerDev, err)
	}
	return netns.Do(ns, true, func() error {
		if err := setOffload(dev, OffloadGRO, true); err != nil {
			return err
		}
		qs, _ := filepath.Glob(filepath.Join("/sys/class/net", dev, "queues/rx-*/rps_cpus"))
		for _, q := range qs {
			if err := os.WriteFile(q, []byte("0\n"), 0); err != nil {
				return fmt.Errorf("clear %s: %w", q, err)
			}
		}
		_, err := threadedPinned(dev, func(NAPIThread) int { return cpu }, LayoutNIC)
		return err
	})
}

// PinNICWire re-applies NICWire's pinning of dev's NAPI kthreads (a lane
// enable may re-create the device's NAPI) and reports whether one had
// drifted.
func PinNICWire(ns, dev string, cpu int) (drifted bool, err error) {
	err = netns.Do(ns, true, func() (err error) {
		drifted, err = repinNAPI(dev, func(NAPIThread) int { return cpu }, LayoutNIC)
		return err
	})
	return drifted, err
}
