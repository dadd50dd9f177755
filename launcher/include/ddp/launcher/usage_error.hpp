#pragma once
// Errors in what the user asked for, raised by any launcher room (the command line, the
// entrypoint's checks) and turned into torchrun's exit status by main: 2 where torchrun's
// argparse stops (CommandLineError), 1 for a value torchrun refuses later.

#include <stdexcept>

namespace ddp::launcher {

// Wrong input on the command line (or in a PET_ variable). what() is one line naming the
// option and the value; main prints it and exits with status 1.
class UsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A command line that does not parse: an unknown or ambiguous option, an option without its
// value, no entrypoint. main exits with status 2, as argparse does.
class CommandLineError : public UsageError {
 public:
  using UsageError::UsageError;
};

// A well-formed option asking for something this ddprun does not do yet (multi-node
// rendezvous). what() names the option and what is missing.
class NotImplementedError : public UsageError {
 public:
  using UsageError::UsageError;
};

}  // namespace ddp::launcher
