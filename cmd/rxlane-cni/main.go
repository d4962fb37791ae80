// Command rxlane-cni is rxlane's chained CNI plugin: the container
// runtime runs it after the plugins that make a container's network, and
// it registers the container's lane request with the rxlane node agent
// (docs/orchestrators.md, "The CNI plugin"). It speaks CNI on stdin,
// stdout and CNI_* variables; run by hand it prints its help.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/rxlane/rxlane/internal/cni"
)

const help = `rxlane-cni: chained CNI plugin for rxlane's priority lanes.

The container runtime runs it (CNI_COMMAND=ADD|DEL|CHECK|STATUS|VERSION,
configuration on stdin); it is not a command for people. Install it in the
runtime's CNI plugin directory (/opt/cni/bin: 'make install') and add it
LAST to a network's conflist, after the plugins that give the container its
addresses:

  {"cniVersion": "1.0.0", "name": "pods", "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true,
     "ipam": {"type": "host-local", "subnet": "10.244.1.0/24"}},
    {"type": "rxlane-cni",
     "capabilities": {"rxlane": true, "io.kubernetes.cri.pod-annotations": true}}
  ]}

Configuration fields:
  socket     the agent's socket (default /run/rxlane/agent.sock)
  stateDir   the agent's state directory (default /run/rxlane): while no
             agent answers, ADD and DEL leave records in STATE_DIR/agent/pending
             that the agent applies when it runs

A container asks for a lane with, first found wins:
  runtimeConfig.rxlane   {"lane": "high", "ports": "5201,8080-8090", "proto": "udp"}
  pod annotations        rxlane.io/lane, rxlane.io/ports, rxlane.io/proto
                         (runtimeConfig."io.kubernetes.cri.pod-annotations",
                         passed by containerd and CRI-O)
  CNI_ARGS               RXLANE_LANE=high;RXLANE_PORTS=5201;RXLANE_PROTO=udp

The container's addresses come from prevResult. A lane can only be asked
for: what it may skip on the node is the agent's configuration alone.
ADD never fails because the agent is down; it fails when the lane request
cannot be given (error code 100) or the container has no address (101).
`

func main() {
	if len(os.Args) > 1 {
		switch strings.TrimLeft(os.Args[1], "-") {
		case "h", "help":
			fmt.Print(help)
			return
		case "version":
			fmt.Println(cni.About)
			fmt.Println("CNI spec versions:", strings.Join(cni.Versions.SupportedVersions(), ", "))
			return
		default:
			fmt.Fprintf(os.Stderr, "rxlane-cni: unknown argument %q: the container runtime runs this plugin with CNI_* variables and no arguments (see rxlane-cni --help)\n", os.Args[1])
			os.Exit(2)
		}
	}
	cni.Run()
}
