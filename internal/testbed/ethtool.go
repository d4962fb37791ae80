package testbed

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Legacy ethtool ioctl commands (include/uapi/linux/ethtool.h). They are
// enough to toggle the few offloads the testbed needs, without a dependency
// on the ethtool binary.
const (
	ethtoolGTXCSUM = 0x16
	ethtoolSTXCSUM = 0x17
	ethtoolGTSO    = 0x1e
	ethtoolSTSO    = 0x1f
	ethtoolGGRO    = 0x2b
	ethtoolSGRO    = 0x2c
)

// Offload names the offloads the testbed sets.
type Offload string

const (
	OffloadGRO    Offload = "gro"
	OffloadTSO    Offload = "tso"
	OffloadTXCsum Offload = "tx-checksum"
)

var offloadCmds = map[Offload][2]uint32{
	OffloadGRO:    {ethtoolGGRO, ethtoolSGRO},
	OffloadTSO:    {ethtoolGTSO, ethtoolSTSO},
	OffloadTXCsum: {ethtoolGTXCSUM, ethtoolSTXCSUM},
}

type ethtoolValue struct {
	cmd  uint32
	data uint32
}

type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte
}

func ethtoolIoctl(dev string, v *ethtoolValue) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr ifreqData
	copy(ifr.name[:], dev)
	ifr.data = uintptr(unsafe.Pointer(v))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(v)
	if errno != 0 {
		return errno
	}
	return nil
}

// setOffload switches an offload of dev in the calling thread's network
// namespace.
func setOffload(dev string, o Offload, on bool) error {
	v := ethtoolValue{cmd: offloadCmds[o][1]}
	if on {
		v.data = 1
	}
	if err := ethtoolIoctl(dev, &v); err != nil {
		return fmt.Errorf("set %s %s=%v: %w", dev, o, on, err)
	}
	return nil
}

// getOffload reads an offload of dev in the calling thread's namespace.
func getOffload(dev string, o Offload) (bool, error) {
	v := ethtoolValue{cmd: offloadCmds[o][0]}
	if err := ethtoolIoctl(dev, &v); err != nil {
		return false, fmt.Errorf("get %s %s: %w", dev, o, err)
	}
	return v.data != 0, nil
}
