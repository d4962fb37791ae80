package isolate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Legacy ethtool ioctls for the RX flow hash indirection table
// (include/uapi/linux/ethtool.h, struct ethtool_rxfh_indir). They are what
// `ethtool -x` / `ethtool -X` use on kernels without ethtool-netlink RSS_SET,
// and they take an explicit table, so revert can restore exactly the old one.
const (
	ethtoolGRXFHINDIR = 0x38
	ethtoolSRXFHINDIR = 0x39
)

type ethtoolRSS struct{}

type ifreqPtr struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte
}

func rxfhIoctl(dev string, buf []byte) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr ifreqPtr
	copy(ifr.name[:], dev)
	ifr.data = uintptr(unsafe.Pointer(&buf[0]))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return errno
	}
	return nil
}

// Table runs in the caller's network namespace.
func (ethtoolRSS) Table(dev string) ([]uint32, error) {
	hdr := make([]byte, 8)
	binary.NativeEndian.PutUint32(hdr, ethtoolGRXFHINDIR)
	if err := rxfhIoctl(dev, hdr); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("%s: %w", dev, ErrNoRSS)
		}
		return nil, fmt.Errorf("get rss table of %s: %w", dev, err)
	}
	n := binary.NativeEndian.Uint32(hdr[4:])
	if n == 0 {
		return nil, fmt.Errorf("%s: %w", dev, ErrNoRSS)
	}
	buf := make([]byte, 8+4*n)
	binary.NativeEndian.PutUint32(buf, ethtoolGRXFHINDIR)
	binary.NativeEndian.PutUint32(buf[4:], n)
	if err := rxfhIoctl(dev, buf); err != nil {
		return nil, fmt.Errorf("get rss table of %s: %w", dev, err)
	}
	out := make([]uint32, n)
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(buf[8+4*i:])
	}
	return out, nil
}

func (ethtoolRSS) SetTable(dev string, table []uint32) error {
	buf := make([]byte, 8+4*len(table))
	binary.NativeEndian.PutUint32(buf, ethtoolSRXFHINDIR)
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(table)))
	for i, q := range table {
		binary.NativeEndian.PutUint32(buf[8+4*i:], q)
	}
	if err := rxfhIoctl(dev, buf); err != nil {
		return fmt.Errorf("set rss table of %s: %w", dev, err)
	}
	return nil
}

// FileRSS keeps each device's table in ROOT/DIR/DEV, one line of
// space-separated queue numbers; a device without a file has no RSS. It is
// the fake NIC of tests and of `--root` dry runs.
type FileRSS struct{ Dir string }

func (f FileRSS) Table(dev string) ([]uint32, error) {
	b, err := os.ReadFile(filepath.Join(f.Dir, dev))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dev, ErrNoRSS)
	}
	if err != nil {
		return nil, err
	}
	return parseTable(string(b))
}

func (f FileRSS) SetTable(dev string, table []uint32) error {
	p := filepath.Join(f.Dir, dev)
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("set rss table of %s: %w", dev, err)
	}
	return os.WriteFile(p, []byte(formatTable(table)+"\n"), 0o644)
}

func formatTable(t []uint32) string {
	s := make([]string, len(t))
	for i, q := range t {
		s[i] = strconv.FormatUint(uint64(q), 10)
	}
	return strings.Join(s, " ")
}

func parseTable(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Fields(s) {
		q, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("rss table: bad queue %q", f)
		}
		out = append(out, uint32(q))
	}
	return out, nil
}

// equalTable is `ethtool -X DEV equal k`: bucket i goes to queue i mod k.
func equalTable(size, k int) []uint32 {
	t := make([]uint32, size)
	for i := range t {
		t[i] = uint32(i % k)
	}
	return t
}
