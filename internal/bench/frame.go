package bench

import (
	"encoding/binary"
	"net"
)

// FrameSpec describes a ready-made background frame: a UDP datagram to a
// sink, either plain (host path) or wrapped in VXLAN (overlay path).
type FrameSpec struct {
	SrcMAC, DstMAC net.HardwareAddr // wire MACs
	SrcIP, DstIP   net.IP           // underlay (host path) addresses
	// Overlay: when VNI is non-zero the UDP datagram goes from InnerSrcIP
	// to InnerDstIP between the container MACs, encapsulated to VXLANPort.
	VNI                      uint32
	VXLANPort                uint16
	InnerSrcMAC, InnerDstMAC net.HardwareAddr
	InnerSrcIP, InnerDstIP   net.IP
	SrcPort, DstPort         uint16 // of the (inner) UDP datagram
	Payload                  int    // UDP payload bytes
}

const (
	ethLen   = 14
	ipv4Len  = 20
	udpLen   = 8
	vxlanLen = 8
)

// Flows returns n frames of s (at least one) whose UDP source ports count
// up from s's, so that each is its own flow with its own hash.
func (s FrameSpec) Flows(n int) [][]byte {
	out := [][]byte{}
	for i := 0; i < max(n, 1); i++ {
		f := s
		f.SrcPort = s.SrcPort + uint16(i)
		out = append(out, f.Build())
	}
	return out
}

// Build returns the complete Ethernet frame.
func (s FrameSpec) Build() []byte {
	inner := make([]byte, udpLen+s.Payload)
	putUDP(inner, s.SrcPort, s.DstPort, s.Payload)
	for i := range s.Payload {
		inner[udpLen+i] = byte(i)
	}
	if s.VNI == 0 {
		return ethernet(s.DstMAC, s.SrcMAC, ipv4(s.SrcIP, s.DstIP, inner))
	}
	innerFrame := ethernet(s.InnerDstMAC, s.InnerSrcMAC, ipv4(s.InnerSrcIP, s.InnerDstIP, inner))
	vx := make([]byte, udpLen+vxlanLen+len(innerFrame))
	// The outer source port carries the flow's entropy, as the kernel's
	// vxlan driver does (udp_flow_src_port).
	putUDP(vx, 32768+s.SrcPort%16384, s.VXLANPort, vxlanLen+len(innerFrame))
	vx[udpLen] = 0x08 // I flag: VNI valid
	binary.BigEndian.PutUint32(vx[udpLen+4:], s.VNI<<8)
	copy(vx[udpLen+vxlanLen:], innerFrame)
	return ethernet(s.DstMAC, s.SrcMAC, ipv4(s.SrcIP, s.DstIP, vx))
}

// putUDP writes a UDP header with a zero checksum (allowed for IPv4 and
// usual for VXLAN), which the receiver does not verify.
func putUDP(b []byte, src, dst uint16, payload int) {
	binary.BigEndian.PutUint16(b[0:], src)
	binary.BigEndian.PutUint16(b[2:], dst)
	binary.BigEndian.PutUint16(b[4:], uint16(udpLen+payload))
	binary.BigEndian.PutUint16(b[6:], 0)
}

func ipv4(src, dst net.IP, l4 []byte) []byte {
	b := make([]byte, ipv4Len+len(l4))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[6] = 0x40 // DF
	b[8] = 64
	b[9] = 17 // UDP
	copy(b[12:16], src.To4())
	copy(b[16:20], dst.To4())
	binary.BigEndian.PutUint16(b[10:], ipChecksum(b[:ipv4Len]))
	copy(b[ipv4Len:], l4)
	return b
}

func ethernet(dst, src net.HardwareAddr, l3 []byte) []byte {
	b := make([]byte, ethLen+len(l3))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	copy(b[ethLen:], l3)
	return b
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
