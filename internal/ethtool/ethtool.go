// Package ethtool reads and switches a device's offloads (GRO, TSO, the
// checksum offloads) with the legacy ethtool ioctls, in the calling
// thread's network namespace or in a given one, without the ethtool
// binary.
package ethtool

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/rxlane/rxlane/internal/netns"
	"golang.org/x/sys/unix"
)

// Offload is an ethtool feature.
type Offload string

// The offloads rxlane reads or toggles.
const (
	GRO    Offload = "gro"
	TSO    Offload = "tso"
	TxCsum Offload = "tx-checksum"
	RxCsum Offload = "rx-checksum"
)

// get and set commands (include/uapi/linux/ethtool.h).
var cmds = map[Offload][2]uint32{
	GRO:    {unix.ETHTOOL_GGRO, unix.ETHTOOL_SGRO},
	TSO:    {unix.ETHTOOL_GTSO, unix.ETHTOOL_STSO},
	TxCsum: {unix.ETHTOOL_GTXCSUM, unix.ETHTOOL_STXCSUM},
	RxCsum: {unix.ETHTOOL_GRXCSUM, unix.ETHTOOL_SRXCSUM},
}

type value struct {
	cmd  uint32
	data uint32
}

type ifreq struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte
}

func ioctl(dev string, v *value) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	var ifr ifreq
	copy(ifr.name[:unix.IFNAMSIZ-1], dev)
	ifr.data = uintptr(unsafe.Pointer(v))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(v)
	if errno != 0 {
		return errno
	}
	return nil
}

// Get reads an offload of dev in the calling thread's namespace.
func Get(dev string, o Offload) (bool, error) {
	c, ok := cmds[o]
	if !ok {
		return false, fmt.Errorf("unknown offload %q", o)
	}
	v := value{cmd: c[0]}
	if err := ioctl(dev, &v); err != nil {
		return false, fmt.Errorf("get %s %s: %w", dev, o, err)
	}
	return v.data != 0, nil
}

// Set switches an offload of dev in the calling thread's namespace.
func Set(dev string, o Offload, on bool) error {
	c, ok := cmds[o]
	if !ok {
		return fmt.Errorf("unknown offload %q", o)
	}
	v := value{cmd: c[1]}
	if on {
		v.data = 1
	}
	if err := ioctl(dev, &v); err != nil {
		return fmt.Errorf("set %s %s=%v: %w", dev, o, on, err)
	}
	return nil
}

// GetIn reads an offload of dev in the namespace file nsPath ("" for the
// caller's).
func GetIn(nsPath, dev string, o Offload) (on bool, err error) {
	err = netns.Do(nsPath, false, func() error {
		on, err = Get(dev, o)
		return err
	})
	return on, err
}

// SetIn sets an offload of dev in the namespace file nsPath ("" for the
// caller's) and returns what it was, so the caller can restore it.
func SetIn(nsPath, dev string, o Offload, on bool) (prev bool, err error) {
	err = netns.Do(nsPath, false, func() error {
		if prev, err = Get(dev, o); err != nil || prev == on {
			return err
		}
		return Set(dev, o, on)
	})
	return prev, err
}
