#include "ddp/inplace.hpp"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "backends.hpp"
#include "ddp/common/worker_contract.hpp"

namespace ddp {

namespace {

// How long one wait of the watcher blocks before it waits again.
constexpr std::chrono::hours kWatchSlice{1};

// Words of the errors a collective fails with when a peer is gone.
constexpr const char* kLostWords[] = {
    "closed by peer",     "reset by peer", "broken pipe",
    "connection refused", "was aborted",   "remote process exited",
};

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// DDPRUN_INPLACE_GENERATION, when set to a generation.
std::optional<int> generation_from_environment() {
  const auto value = get_env(contract::kInplaceGeneration);
  if (!value || value->empty()) return std::nullopt;
  try {
    std::size_t used = 0;
    const int generation = std::stoi(*value, &used);
    if (used != value->size() || generation < 0) return std::nullopt;
    return generation;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string seconds_text(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", std::chrono::duration<double>(ms).count());
  return text;
}

}  // namespace

// Once ddprun begins the generation after the one this rank is in, aborts that generation's
// Context: a rank that waits on a survivor (which waits too) is freed at once, instead of at
// the collective timeout. Then waits until the rank joined the next one, and watches that.
class InplaceJob::Watcher {
 public:
  Watcher(std::shared_ptr<store::Store> store, std::string root, int generation)
      : store_(std::move(store)),
        root_(std::move(root)),
        thread_([this, generation] { run(generation); }) {}
  ~Watcher() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      changed_.notify_all();
    }
    store_->interrupt();
    thread_.join();
  }
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // The Context of `generation` (nullptr: none, while the rank changes generations).
  void attach(Context* context, int generation) {
    std::lock_guard lock(mutex_);
    context_ = context;
    generation_ = generation;
    changed_.notify_all();
  }
  // Whether this watcher aborted the Context of `generation`.
  bool aborted(int generation) {
    std::lock_guard lock(mutex_);
    return aborted_generation_ == generation;
  }

 private:
  void run(int watched) {
    while (true) {
      const std::string key = root_ + "g" + std::to_string(watched + 1) + "/announced";
      std::string failed;
      try {
        while (true) {
          try {
            store_->wait({key}, kWatchSlice);
            break;
          } catch (const store::StoreTimeout&) {
          }
        }
        failed = store_->get(key);
      } catch (const std::exception&) {
        return;  // interrupted (the job ends) or the store is gone (so is the job)
      }
      std::unique_lock lock(mutex_);
      if (stopping_) return;
      if (context_ != nullptr && generation_ == watched) {
        context_->abort("ddprun began in-place generation " + std::to_string(watched + 1) +
                        ": rank " + failed + " was lost");
        aborted_generation_ = watched;
      }
      ++watched;
      changed_.wait(lock, [&] { return stopping_ || generation_ >= watched; });
      if (stopping_) return;
    }
  }

  std::shared_ptr<store::Store> store_;  // this thread's own connection
  const std::string root_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  Context* context_ = nullptr;
  int generation_ = -1;
  int aborted_generation_ = -1;
  std::thread thread_;  // last: starts once the rest is made
};

InplaceJob::InplaceJob(InplaceOptions options) : options_(std::move(options)) {
  const auto generation = generation_from_environment();
  if (!generation) {
    context_ = std::make_unique<Context>(init(options_.init));
    holds_state_ = true;
    return;
  }
  env_ = LaunchEnv::from_environment();
  recovers_ = true;
  generation_ = *generation;
  root_ = "/ddprun/inplace/" + std::to_string(env_.restart_count) + "/";
  auto [store, keep_alive] = detail::connect_store(env_, options_.init);
  store_ = std::move(store);
  keep_alive_ = std::move(keep_alive);
  join();
  watcher_ =
      std::make_unique<Watcher>(detail::connect_client(env_, options_.init), root_, generation_);
  watcher_->attach(context_.get(), generation_);
  replacement_ = generation_ > 0;
  needs_state_ = replacement_;  // the state comes from a survivor
  holds_state_ = !needs_state_;
  if (!needs_state_) mark_joined();
}

InplaceJob::~InplaceJob() {
  watcher_.reset();  // before the Context it may abort
  context_.reset();
  // This rank joins no later generation: a recovery that begins (or waits) now falls back at
  // once rather than waiting for it (docs/inplace.md, the protocol's `left`).
  if (store_) {
    try {
      store_->add(root_ + "left", 1);
    } catch (const std::exception&) {  // the store is gone: nothing waits on it
    }
  }
}

Context& InplaceJob::context() {
  if (!context_) {
    throw PeerLost("rank " + std::to_string(env_.rank) + " has no Context: it left generation " +
                   std::to_string(generation_) + " and joined no other");
  }
  return *context_;
}

void InplaceJob::keep(SaveState save, LoadState load) {
  save_ = std::move(save);
  load_ = std::move(load);
}

void InplaceJob::on_context(std::function<void(Context&)> formed, std::function<void()> leaving) {
  formed_ = std::move(formed);
  leaving_ = std::move(leaving);
}

std::string InplaceJob::key(int generation, const std::string& name) const {
  return root_ + "g" + std::to_string(generation) + "/" + name;
}

void InplaceJob::join() {
  InitOptions init = options_.init;
  if (generation_ > 0) init.init_timeout = options_.recovery_timeout;
  context_ =
      std::make_unique<Context>(detail::init_under(env_, store_, key(generation_, "pg"), init));
}

void InplaceJob::mark_joined() {
  const auto joined = store_->add(key(generation_, "joined"), 1);
  if (joined == env_.world_size) store_->set(key(generation_, "done"), std::to_string(generation_));
}

bool InplaceJob::announced() {
  try {
    return store_->check({key(generation_ + 1, "announced")});
  } catch (const std::exception&) {
    return false;
  }
}

bool InplaceJob::lost_peer(const std::exception& error) {
  if (dynamic_cast<const PeerLost*>(&error) != nullptr) return false;  // given up already
  if (watcher_->aborted(generation_) || announced()) return true;
  if (dynamic_cast<const CommError*>(&error) == nullptr) return false;
  const std::string text = lower(error.what());
  return std::any_of(std::begin(kLostWords), std::end(kLostWords),
                     [&](const char* word) { return text.find(word) != std::string::npos; });
}

void InplaceJob::ready() {
  if (needs_state_) {
    take_state();
    needs_state_ = false;
    mark_joined();
  }
  if (!formed_called_ && formed_) {
    formed_(context());
    formed_called_ = true;
  }
}

bool InplaceJob::attempt(const std::function<void(Context&)>& step) {
  try {
    ready();
    step(context());
    return true;
  } catch (const std::exception& error) {
    if (!recovers_ || !lost_peer(error)) throw;
    recover(error.what());
    return false;
  }
}

void InplaceJob::recover(const std::string& why) {
  const int rank = recovers_ ? env_.rank : context().rank();
  if (!recovers_) {
    throw PeerLost("rank " + std::to_string(rank) + " lost a peer: " + why);
  }
  const auto started = std::chrono::steady_clock::now();
  const int next = generation_ + 1;
  // Everything of the broken generation ends now: what runs fails at once.
  context().abort("rank " + std::to_string(rank) + " leaves generation " +
                  std::to_string(generation_) + ": " + why);
  if (formed_called_ && leaving_) leaving_();
  formed_called_ = false;
  watcher_->attach(nullptr, generation_);
  context_.reset();
  try {
    store_->wait({key(next, "announced")}, options_.recovery_timeout);
  } catch (const std::exception& waited) {
    throw PeerLost("rank " + std::to_string(rank) + " lost a peer (" + why +
                   "), and ddprun started no generation " + std::to_string(next) + " within " +
                   seconds_text(options_.recovery_timeout) + " s (" + waited.what() +
                   "): the job cannot recover in place");
  }
  generation_ = next;
  join();
  watcher_->attach(context_.get(), generation_);
  needs_state_ = true;
  ready();
  ++recoveries_;
  last_recovery_time_ = std::chrono::steady_clock::now() - started;
}

// Every rank of the new generation runs this with the same collectives: the rank with the
// highest committed step (the lowest such rank) sends its state to all.
void InplaceJob::take_state() {
  Context& ctx = *context_;
  std::int64_t mine = holds_state_ ? step_ : -1;
  std::vector<std::int64_t> steps(static_cast<std::size_t>(ctx.world_size()));
  ctx.allgather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(steps));
  const auto best = std::max_element(steps.begin(), steps.end());
  if (*best < 0) {  // nobody holds state: every rank starts afresh
    holds_state_ = true;
    return;
  }
  const int source = static_cast<int>(best - steps.begin());
  std::vector<std::byte> bytes;
  if (ctx.rank() == source && save_) bytes = save_();
  std::int64_t size = static_cast<std::int64_t>(bytes.size());
  ctx.broadcast(std::span<std::int64_t>(&size, 1), source);
  std::vector<std::int64_t> words((static_cast<std::size_t>(size) + 7) / 8);
  if (ctx.rank() == source && size > 0) std::memcpy(words.data(), bytes.data(), bytes.size());
  if (!words.empty()) ctx.broadcast(std::span<std::int64_t>(words), source);
  if (ctx.rank() != source && load_) {
    load_(std::span<const std::byte>(reinterpret_cast<const std::byte*>(words.data()),
                                     static_cast<std::size_t>(size)));
  }
  step_ = *best;
  holds_state_ = true;
}

}  // namespace ddp
