#pragma once
// This host's address as other hosts see it: the one way ddprun finds it (the rendezvous
// records it for each node; every backend, store or etcd, uses this).

#include <string>

namespace ddp::store {

// The local address of this host on the route to host:port ("10.0.0.5", "::1"): the address
// another host reaches this one at on that route. Opens a UDP socket and connects it, which
// picks the route and sends nothing. Empty when host does not resolve or has no route.
std::string local_address_towards(const std::string& host, int port);

}  // namespace ddp::store
