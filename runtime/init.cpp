#include <unistd.h>

#include <array>

#include "backends.hpp"
#include "collective_recorder.hpp"
#include "ddp/common/host_name.hpp"
#include "ddp/context.hpp"
#include "ddp/store/prefix_store.hpp"
#include "gloo_communicator.hpp"

namespace ddp {

namespace {

Backend choose_backend(const InitOptions& options) {
  if (options.backend) return *options.backend;
  if (auto name = get_env("DDP_BACKEND"); name && !name->empty()) {
    if (*name == "nccl") return Backend::Nccl;
    if (*name == "gloo") return Backend::Gloo;
    throw EnvError("DDP_BACKEND='" + *name + "' is neither 'nccl' nor 'gloo'");
  }
  return detail::nccl_usable() ? Backend::Nccl : Backend::Gloo;
}

MismatchCheck choose_check(const InitOptions& options) {
  if (options.mismatch_check) return *options.mismatch_check;
  auto debug = get_env("DDP_DEBUG");
  return debug && *debug == "1" ? MismatchCheck::Always : MismatchCheck::FirstCall;
}

}  // namespace

namespace detail {

std::unique_ptr<Communicator> make_gloo_communicator(store::Store& store, const LaunchEnv& env,
                                                     const InitOptions& options,
                                                     MismatchCheck check) {
  GlooOptions gloo;
  gloo.hostname = options.local_addr;
  if (gloo.hostname.empty()) gloo.hostname = get_env("DDP_LOCAL_ADDR").value_or("");
  if (gloo.hostname.empty() && env.local_world_size == env.world_size) {
    gloo.hostname = "127.0.0.1";  // the whole job is on this node
  }
  if (gloo.hostname.empty()) gloo.hostname = host_name();
  gloo.connect_timeout = options.init_timeout;
  gloo.timeout = options.timeout;
  gloo.mismatch_check = check;
  const auto shm = get_env("DDP_SHM");
  gloo.shared_memory =
      options.shared_memory && env.local_world_size == env.world_size && !(shm && *shm == "0");
  return std::make_unique<GlooCommunicator>(store, env.rank, env.world_size, gloo);
}

}  // namespace detail

namespace {

Context build_context(const LaunchEnv& env, std::shared_ptr<store::Store> base,
                      const InitOptions& options, std::shared_ptr<void> keep_alive,
                      const std::string& prefix) {
  auto job_store = std::make_shared<store::PrefixStore>(prefix, std::move(base));
  job_store->set_timeout(options.init_timeout);
  const Backend backend = choose_backend(options);
  const MismatchCheck check = choose_check(options);
  // The n-th Context a rank builds in this attempt uses keys of its own (ranks build their
  // Contexts in the same order, as with PyTorch's process groups): a second init() must not
  // read the first one's mesh addresses or shared-memory segment.
  const auto instance = job_store->add("contexts/rank_" + std::to_string(env.rank), 1);
  auto backend_store = std::make_shared<store::PrefixStore>(
      std::string(to_string(backend)) + "/" + std::to_string(instance), job_store);
  backend_store->set_timeout(options.init_timeout);
  std::unique_ptr<Communicator> communicator =
      backend == Backend::Nccl
          ? detail::make_nccl_communicator(backend_store, env, options, check)
          : detail::make_gloo_communicator(*backend_store, env, options, check);
  job_store->set_timeout(store::kDefaultTimeout);
  communicator->set_recorder(
      detail::CollectiveRecorder::attach(options.record_fd, env.rank, env.world_size, backend,
                                         options.timeout, static_cast<std::uint64_t>(instance)));
  return Context(env, std::move(job_store), std::move(communicator), options.timeout,
                 std::move(keep_alive));
}

std::string attempt_prefix(const LaunchEnv& env) {
  return "ddp/attempt_" + std::to_string(env.restart_count);
}

}  // namespace

Context detail::init_under(const LaunchEnv& env, std::shared_ptr<store::Store> store,
                           const std::string& prefix, const InitOptions& options) {
  return build_context(env, std::move(store), options, nullptr, prefix);
}

Context init(const LaunchEnv& env, std::shared_ptr<store::Store> store,
             const InitOptions& options) {
  return build_context(env, std::move(store), options, nullptr, attempt_prefix(env));
}

Context init(const InitOptions& options) {
  const LaunchEnv env = LaunchEnv::from_environment();
  auto [store, keep_alive] = detail::connect_store(env, options);
  return build_context(env, std::move(store), options, std::move(keep_alive), attempt_prefix(env));
}

}  // namespace ddp
