// TEMPORARY, until branch `rdzv` (the rendezvous engine, rendezvous/elastic/) is merged: the
// coordinator deletes this file (and its line in launcher/CMakeLists.txt) at that merge.
// It lets ddprun link while the engine is written in parallel; a multi-node run says so.
#include "ddp/elastic/rendezvous.hpp"

namespace ddp::elastic {

std::unique_ptr<Rendezvous> make_store_rendezvous(RendezvousSettings settings) {
  throw RendezvousError("cannot join the rendezvous at " + settings.store_host + ":" +
                        std::to_string(settings.store_port) +
                        ": this build has no multi-node rendezvous engine yet");
}

}  // namespace ddp::elastic
