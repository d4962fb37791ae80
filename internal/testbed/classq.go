package testbed

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// wireQueues is the number of queues of each wire end in the nicmq
// layout: 0 for the flood, 1 for the high-priority class.
const wireQueues = 2

// Offsets in an untagged VXLAN-in-IPv4 frame (no IP options) from the
// Ethernet header: outer Ethernet 14, IPv4 20, UDP 8, VXLAN 8, inner
// Ethernet 14, inner IPv4 20.
const (
	offEtherType = 12
	offOuterProt = 14 + 9
	offOuterDst  = 14 + 20 + 2
	offInnerType = 14 + 20 + 8 + 8 + 12
	offInnerProt = 14 + 20 + 8 + 8 + 14 + 9
	offInnerDst  = 14 + 20 + 8 + 8 + 14 + 20 + 2
	classHdrLen  = offInnerDst + 2
	// __sk_buff field offsets (include/uapi/linux/bpf.h).
	skbQueueMapping = 12
	skbData         = 76
	skbDataEnd      = 80
)

func htons(v uint16) int32 { return int32(v>>8 | v<<8&0xff00) }

// classifierSpec is the nicmq layout's stand-in for a NIC's flow rule, a
// tc egress program on hostA's wire: a VXLAN frame to UDP port vxPort
// whose inner UDP destination port is port gets queue_mapping 2, anything
// else 1. (This kernel has no act_skbedit. A queue_mapping written at tc
// egress is not used as the transmit queue directly: the device's queue
// choice that follows reads a non-zero queue_mapping as a recorded
// receive queue q+1 and, veth having no XPS, picks q: 2 -> queue 1, 1 ->
// queue 0. veth then delivers a frame sent on queue q to the peer's rx
// queue q.)
func classifierSpec(vxPort, port int) *ebpf.ProgramSpec {
	const other = "other"
	match := func(size asm.Size, off int16, v int32) asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(asm.R5, asm.R2, off, size),
			asm.JNE.Imm(asm.R5, v, other),
		}
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skbData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, classHdrLen),
		asm.JGT.Reg(asm.R4, asm.R3, other),
	}
	insns = append(insns, match(asm.Half, offEtherType, htons(unix.ETH_P_IP))...)
	insns = append(insns, match(asm.Byte, offOuterProt, unix.IPPROTO_UDP)...)
	insns = append(insns, match(asm.Half, offOuterDst, htons(uint16(vxPort)))...)
	insns = append(insns, match(asm.Half, offInnerType, htons(unix.ETH_P_IP))...)
	insns = append(insns, match(asm.Byte, offInnerProt, unix.IPPROTO_UDP)...)
	insns = append(insns, match(asm.Half, offInnerDst, htons(uint16(port)))...)
	insns = append(insns,
		asm.Mov.Imm(asm.R7, 2),
		asm.StoreMem(asm.R6, skbQueueMapping, asm.R7, asm.Word),
		asm.Mov.Imm(asm.R0, 0), // TC_ACT_OK
		asm.Return(),
		asm.Mov.Imm(asm.R7, 1).WithSymbol(other),
		asm.StoreMem(asm.R6, skbQueueMapping, asm.R7, asm.Word),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
	return &ebpf.ProgramSpec{Name: "rxl_classq", Type: ebpf.SchedCLS, Instructions: insns, License: "GPL"}
}

// classRings installs the classifier on hostA's wire egress (clsact).
// Frames that bypass the qdisc layer (AF_PACKET with PACKET_QDISC_BYPASS)
// are not classified: the benchmarks' injector goes through it on this
// layout. Qdisc and filter live in hostA's namespace and go with it.
func classRings(c Config) error {
	return Do(c, HostA, func() error {
		l, err := netlink.LinkByName(WireA)
		if err != nil {
			return err
		}
		prog, err := ebpf.NewProgram(classifierSpec(c.Port, c.classPort()))
		if err != nil {
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				return fmt.Errorf("load class classifier: %+v", ve)
			}
			return fmt.Errorf("load class classifier: %w", err)
		}
		defer prog.Close() // the filter keeps its own reference
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := netlink.QdiscAdd(q); err != nil {
			return fmt.Errorf("clsact on %s: %w", WireA, err)
		}
		f := &netlink.BpfFilter{
			FilterAttrs:  netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_EGRESS, Priority: 1, Protocol: unix.ETH_P_ALL},
			Fd:           prog.FD(),
			Name:         "rxl_classq",
			DirectAction: true,
		}
		if err := netlink.FilterAdd(f); err != nil {
			return fmt.Errorf("class classifier on %s: %w", WireA, err)
		}
		return nil
	})
}
