#include "watch/inplace_generations.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "ddp/store/client.hpp"
#include "watch/workers_store_client.hpp"

namespace ddp::launcher {

namespace {

// Each request to the workers' store (a wait aside) is answered at once on a live store.
constexpr std::chrono::milliseconds kRequestTimeout{10000};

// How often a recovery that waits for its generation checks whether a rank ended meanwhile.
constexpr std::chrono::milliseconds kLeftCheckPeriod{500};

// The most of a worker's `stuck` line that the fallback's line shows.
constexpr std::size_t kStuckTextMax = 400;

// A key as PyTorch's TCPStore client sends it: with a "/" before the program's key.
std::string wire(const std::string& key) { return "/" + key; }

std::string key(const elastic::RoundInfo& round, int generation, const std::string& name) {
  return wire(inplace_prefix(round) + "g" + std::to_string(generation) + "/" + name);
}

}  // namespace

std::string inplace_prefix(const elastic::RoundInfo& round) {
  return "ddprun/inplace/" + std::to_string(round.restart_count) + "/";
}

InplaceGenerations::~InplaceGenerations() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (auto& client : clients_) client->interrupt();
  }
  for (auto& thread : threads_) thread.join();
}

bool InplaceGenerations::stopping() {
  std::lock_guard lock(mutex_);
  return stopping_;
}

void InplaceGenerations::run(std::function<void(store::Client&)> task,
                             const elastic::RoundInfo& round,
                             std::function<void(const std::string&)> failed) {
  std::lock_guard lock(mutex_);
  if (stopping_) return;
  // Connected on the thread: the store may be served by the loop that calls this.
  threads_.emplace_back([this, task = std::move(task), failed = std::move(failed),
                         options = workers_store_options(round, kRequestTimeout)] {
    try {
      auto client = std::make_shared<store::Client>(options);
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        clients_.push_back(client);
      }
      // Its connection closes once the task is done: the agent that serves the store waits,
      // at the job's end, for the connections to it to close.
      struct Forget {
        InplaceGenerations* self;
        std::shared_ptr<store::Client> client;
        ~Forget() {
          std::lock_guard lock(self->mutex_);
          std::erase(self->clients_, client);
        }
      } forget{this, client};
      task(*client);
    } catch (const std::exception& e) {
      failed(e.what());
    }
  });
}

void InplaceGenerations::begin(const elastic::RoundInfo& round, int rank, Begun answer) {
  auto done = [this, answer](int generation, const std::string& why) {
    if (!stopping()) answer(generation, why);
  };
  const std::string prefix = wire(inplace_prefix(round));
  const int world = elastic::worker_ranks(round, 0).world_size;
  auto task = [round, rank, world, prefix, done](store::Client& store) {
    const auto current = static_cast<int>(store.add(prefix + "generation", 0));
    const auto left = store.add(prefix + "left", 0);
    if (left > 0) {
      return done(0, left == 1 ? "1 rank had already ended its program (its job done), so it "
                                 "cannot join the next generation"
                               : std::to_string(left) +
                                     " ranks had already ended their program (their job done), "
                                     "so they cannot join the next generation");
    }
    if (!store.check({key(round, current, "done")})) {
      const auto joined = store.add(key(round, current, "joined"), 0);
      if (current == 0 && joined == 0) {
        return done(0,
                    "no rank had formed its process group through ddprun.inplace or "
                    "ddp::InplaceJob (a program that does not use them, or a failure before "
                    "they began; docs/inplace.md)");
      }
      if (current == 0) {
        return done(0, "only " + std::to_string(joined) + " of " + std::to_string(world) +
                           " ranks had formed their process group through ddprun.inplace or "
                           "ddp::InplaceJob");
      }
      return done(0, "generation " + std::to_string(current) +
                         " was still forming (a second failure during a recovery)");
    }
    const auto next = static_cast<int>(store.add(prefix + "generation", 1));
    if (next != current + 1) {
      return done(0, "another node began a recovery at the same time (generation " +
                         std::to_string(next - 1) + ")");
    }
    store.set(key(round, next, "announced"), std::to_string(rank));
    done(next, "");
  };
  run(std::move(task), round, [done](const std::string& what) {
    done(0, "the workers' store did not answer (" + what + ")");
  });
}

void InplaceGenerations::watch(const elastic::RoundInfo& round, int generation,
                               std::chrono::milliseconds limit, Formed answer) {
  auto done = [this, answer](const std::string& why) {
    if (!stopping()) answer(why);
  };
  const std::string formed = key(round, generation, "done");
  const std::string left = wire(inplace_prefix(round) + "left");
  const std::string joined = key(round, generation, "joined");
  const std::string stuck = key(round, generation, "stuck");
  const int world = elastic::worker_ranks(round, 0).world_size;
  auto task = [formed, left, joined, stuck, world, limit, generation, done](store::Client& store) {
    // In slices: a rank that ends its program meanwhile never joins (ddprun.inplace says so
    // in `left` as its program ends), nor one that its watcher finds stuck in the old group
    // (it says why in `stuck`); the limit is for a rank that never comes.
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      const auto slice = std::min<std::chrono::milliseconds>(
          kLeftCheckPeriod, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
      try {
        store.wait({formed}, std::max(slice, std::chrono::milliseconds{1}));
        return done("");
      } catch (const store::StoreTimeout&) {
        if (std::chrono::steady_clock::now() >= deadline) {
          throw std::runtime_error(std::to_string(store.add(joined, 0)) + " of " +
                                   std::to_string(world) + " ranks joined it");
        }
      }
      if (const auto ended = store.add(left, 0); ended > 0) {
        return done(std::to_string(ended) +
                    (ended == 1 ? " rank ended its program" : " ranks ended their program") +
                    " while generation " + std::to_string(generation) + " formed");
      }
      if (store.check({stuck})) {
        std::string why = store.get(stuck);  // the worker's one line, shown as text
        if (why.size() > kStuckTextMax) why.resize(kStuckTextMax);
        std::replace_if(
            why.begin(), why.end(), [](unsigned char c) { return c < 0x20; }, ' ');
        return done(why);
      }
    }
  };
  const auto seconds = std::chrono::duration<double>(limit).count();
  run(std::move(task), round, [done, generation, seconds](const std::string& what) {
    char limit_text[32];
    std::snprintf(limit_text, sizeof limit_text, "%g", seconds);
    done("generation " + std::to_string(generation) + " did not form within " + limit_text +
         " s (" + what + ")");
  });
}

}  // namespace ddp::launcher
