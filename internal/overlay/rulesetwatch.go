package overlay

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// WatchRuleset signals ch whenever nf_tables' ruleset changes in
// namespace ns: iptables-nft's and nft's changes alike (the kernel's
// NFNLGRP_NFTABLES events), so that a rule added after discovery (a
// NetworkPolicy's) is re-checked by the forward path proof at once, not
// at the next periodic sync. Legacy iptables sends no events: only a
// periodic sync sees its changes. ch gets at most one pending signal (a
// burst of events is one change to re-check); a lost event (the
// socket's buffer overflowed) is a change too. It stops when done is
// closed; onErr gets the error that ends it early. A kernel without
// nfnetlink has no ruleset to watch: nil, and ch never signals.
func WatchRuleset(ns vnetns.NsHandle, ch chan<- struct{}, done <-chan struct{}, onErr func(error)) error {
	s, err := nl.SubscribeAt(ns, vnetns.None(), unix.NETLINK_NETFILTER, unix.NFNLGRP_NFTABLES)
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listen to nftables events: %w", err)
	}
	go func() {
		<-done
		s.Close()
	}()
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	go func() {
		for {
			_, _, err := s.Receive()
			switch {
			case err == nil:
				signal()
			case errors.Is(err, unix.ENOBUFS):
				signal()
			default:
				select {
				case <-done:
				default:
					onErr(fmt.Errorf("nftables events: %w", err))
				}
				return
			}
		}
	}()
	return nil
}
