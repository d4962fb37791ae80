package testbed

import "github.com/rxlane/rxlane/internal/ethtool"

// Offload names the offloads the testbed sets.
type Offload = ethtool.Offload

const (
	OffloadGRO    = ethtool.GRO
	OffloadTSO    = ethtool.TSO
	OffloadTXCsum = ethtool.TxCsum
)

func setOffload(dev string, o Offload, on bool) error { return ethtool.Set(dev, o, on) }

func getOffload(dev string, o Offload) (bool, error) { return ethtool.Get(dev, o) }
