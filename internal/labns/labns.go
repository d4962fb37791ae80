// Package labns knows which network namespaces rxlane's lab built:
// internal/testbed keeps one state file per testbed in Dir and names the
// namespace of each of its nodes PREFIX-NODE. A library package that may
// change a namespace only if the lab owns it (steer's --sender-tx-off)
// asks here instead of importing the testbed.
package labns

import (
	"errors"
	"os"
	"slices"
	"strings"
)

// The testbed's nodes (testbed.Node).
const (
	HostA = "hostA"
	HostB = "hostB"
	CtrA  = "ctrA"
	CtrB  = "ctrB"
)

// Nodes lists every node in creation order.
var Nodes = []string{HostA, HostB, CtrA, CtrB}

// Dir keeps one JSON file per testbed (PREFIX.json) so status, exec and
// bench can recall its configuration. It lives on tmpfs: a reboot removes
// namespaces and state together.
var Dir = "/run/rxlane/testbed"

// NS returns the namespace name of node of the testbed prefix.
func NS(prefix, node string) string { return prefix + "-" + node }

// Prefixes returns the prefixes of testbeds that have a state file.
func Prefixes() ([]string, error) {
	ents, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if p, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// Created reports whether ns is the namespace of a node of a testbed
// rxlane built (one with a state file in Dir).
func Created(ns string) bool {
	prefixes, err := Prefixes()
	if err != nil {
		return false
	}
	for _, p := range prefixes {
		if slices.ContainsFunc(Nodes, func(n string) bool { return NS(p, n) == ns }) {
			return true
		}
	}
	return false
}
