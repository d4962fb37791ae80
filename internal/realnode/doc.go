// Package realnode brings real overlay daemons up in namespaces and tears
// them down completely.
//
// Where package nodes builds the layouts Flannel, Calico and Docker leave
// on a node by hand, with netlink, this package runs the daemons
// themselves (flanneld with its etcd datastore and the CNI chain its users
// run; Docker's swarm overlay) inside fresh, uniquely named network
// namespaces joined by a veth wire, so rxlane's lanes and steering can be
// proven on what the real software builds, not on our copy of it.
//
// Every handle's Close stops the daemons it started (by PID: SIGTERM,
// then SIGKILL after a bounded wait), deletes every namespace it created
// (and with them the devices, routes and netfilter rules the daemons made
// there) and every file it wrote; it is safe after a half-failed Up and
// may be called again.
package realnode
