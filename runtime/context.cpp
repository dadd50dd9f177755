#include "ddp/context.hpp"

namespace ddp {

Context::Context(LaunchEnv env, std::shared_ptr<store::Store> store,
                 std::unique_ptr<Communicator> communicator, std::chrono::milliseconds timeout,
                 std::shared_ptr<void> keep_alive)
    : env_(std::move(env)), keep_alive_(std::move(keep_alive)), store_(std::move(store)),
      communicator_(std::move(communicator)), timeout_(timeout) {}

Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;

Context::~Context() {
  // The communicator goes before the store it was built through, and the store client
  // before the server that rank 0 may host.
  communicator_.reset();
  store_.reset();
}

void Context::check_sizes(const char* op, std::size_t part, std::size_t whole) const {
  const auto expected = part * static_cast<std::size_t>(world_size());
  if (whole != expected) {
    throw CommError(std::string(op) + " on rank " + std::to_string(rank()) +
                    ": the gathered buffer has " + std::to_string(whole) +
                    " elements, expected world_size " + std::to_string(world_size()) + " x " +
                    std::to_string(part) + " = " + std::to_string(expected));
  }
}

}  // namespace ddp
