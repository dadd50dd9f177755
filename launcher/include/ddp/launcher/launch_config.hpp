#pragma once
// LaunchConfig: everything the agent needs to start a job, parsed from torchrun's options.

namespace ddp::launcher {

struct LaunchConfig {};

}  // namespace ddp::launcher
