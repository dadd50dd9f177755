#pragma once
// Who may connect to the stores an agent serves (docs/elastic.md, "Who may connect to the
// stores"): the workers' store of a round admits the round's nodes and loopback; a one-node
// store listening on every address admits this host's own addresses and loopback. The
// rendezvous store admits anyone (agents join through it before they are members).
// --store_allow_any turns all of it off. Internal to the launcher.

#include <vector>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/admission.hpp"

namespace ddp::launcher {

// The end of every refusal line: what to do about a refusal that should not have happened.
inline constexpr const char* kAllowAnyHint =
    "behind NAT or a proxy, --store_allow_any admits every address";

// A round's workers' store before the round closed: loopback now, other peers held until
// admit_members() is set (nobody else knows its port before the round closes).
store::Admission admit_round_pending();

// A round's workers' store once the round closed: each member's address (a host name is
// resolved, every address it has; one that does not resolve admits nothing) and loopback.
// Resolving may block on the system resolver: call it off the agent's loop.
store::Admission admit_members(const std::vector<elastic::Member>& members);

// A one-node store listening on every address: this host's interface addresses and
// loopback (workers connect to MASTER_ADDR, one of this host's addresses).
store::Admission admit_this_host();

}  // namespace ddp::launcher
