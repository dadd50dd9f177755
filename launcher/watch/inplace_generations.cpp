#include "watch/inplace_generations.hpp"

#include <cstdio>

#include "ddp/store/client.hpp"
#include "watch/workers_store_client.hpp"

namespace ddp::launcher {

namespace {

// Each request to the workers' store (a wait aside) is answered at once on a live store.
constexpr std::chrono::milliseconds kRequestTimeout{10000};

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
  auto task = [formed, limit, done](store::Client& store) {
    store.wait({formed}, limit);
    done("");
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
