// A worker for the multi-process tests: started under ddprun or torchrun, it runs one check
// over real processes and prints "ok rank=<r>" or the failure (exit 1).
//   ddp-runtime-worker collectives | reducer
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "ddp/runtime.hpp"

namespace {

void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error("check failed: " + what);
}

template <typename T>
void allreduce_all_ops(ddp::Context& ctx, std::size_t count) {
  const int w = ctx.world_size();
  const T ranks_sum = static_cast<T>(w * (w + 1) / 2);
  for (auto op : {ddp::ReduceOp::Sum, ddp::ReduceOp::Avg, ddp::ReduceOp::Min, ddp::ReduceOp::Max}) {
    std::vector<T> v(count, static_cast<T>(ctx.rank() + 1));
    ctx.allreduce(std::span<T>(v), op);
    const T expected = op == ddp::ReduceOp::Sum   ? ranks_sum
                       : op == ddp::ReduceOp::Avg ? static_cast<T>(ranks_sum / static_cast<T>(w))
                       : op == ddp::ReduceOp::Min ? T(1)
                                                  : static_cast<T>(w);
    for (const T& x : v) {
      expect(x == expected, std::string("allreduce ") + ddp::to_string(op) + " " +
                                ddp::to_string(ddp::dtype_of<T>) + " x " + std::to_string(count));
    }
  }
}

void collectives(ddp::Context& ctx) {
  const int w = ctx.world_size();
  for (std::size_t count : {0u, 1u, 7u, 65537u}) {
    allreduce_all_ops<float>(ctx, count);
    allreduce_all_ops<double>(ctx, count);
    allreduce_all_ops<std::int32_t>(ctx, count);
    allreduce_all_ops<std::int64_t>(ctx, count);
    std::vector<std::int64_t> b(count, ctx.rank() == w - 1 ? 42 : 0);
    ctx.broadcast(std::span<std::int64_t>(b), w - 1);
    for (auto x : b) expect(x == 42, "broadcast x " + std::to_string(count));
    std::vector<double> in(count, ctx.rank()), out(count * w);
    ctx.allgather(std::span<double>(in), std::span<double>(out));
    for (std::size_t i = 0; i < out.size(); ++i) {
      expect(out[i] == static_cast<double>(i / count), "allgather x " + std::to_string(count));
    }
    std::vector<float> whole(count * w, 1.0f), part(count);
    ctx.reduce_scatter(std::span<float>(whole), std::span<float>(part));
    for (auto x : part) expect(x == static_cast<float>(w), "reduce_scatter x " + std::to_string(count));
  }
  std::vector<float> big(16u << 20, 1.0f);  // 16 M elements, once
  ctx.allreduce(std::span<float>(big));
  expect(std::count(big.begin(), big.end(), static_cast<float>(w)) ==
             static_cast<std::ptrdiff_t>(big.size()), "allreduce f32 x 16M");
  ctx.barrier();
}

void reducer(ddp::Context& ctx) {
  std::mt19937 shape(7);  // same shapes on every rank
  std::vector<std::vector<float>> storage(40);
  for (auto& p : storage) p.assign(shape() % 50000, 0.0f);
  std::vector<ddp::Parameter> parameters;
  for (std::size_t i = 0; i < storage.size(); ++i) {
    parameters.push_back({"p" + std::to_string(i), std::span<float>(storage[i])});
  }
  ddp::ReducerOptions options;
  options.first_bucket_mb = 0.05;
  options.bucket_cap_mb = 0.3;
  ddp::Reducer red(ctx, parameters, options);
  std::mt19937 rng(100 + ctx.rank());  // different values and ready orders per rank
  for (int step = 0; step < 3; ++step) {
    std::vector<float> everything;
    for (std::size_t i = 0; i < red.size(); ++i) {
      for (float& g : red.grad(i)) {
        g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 128.0f;
        everything.push_back(g);
      }
    }
    std::vector<std::size_t> order(red.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (auto i : order) red.mark_ready(i);
    red.finalize();
    ctx.allreduce(std::span<float>(everything), ddp::ReduceOp::Avg);
    std::size_t k = 0;
    for (std::size_t i = 0; i < red.size(); ++i) {
      for (float g : red.grad(i)) expect(g == everything[k++], "reducer == one allreduce");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  try {
    ddp::Context ctx = ddp::init();
    if (mode == "collectives") collectives(ctx);
    else if (mode == "reducer") reducer(ctx);
    else throw std::runtime_error("unknown mode " + mode);
    std::printf("ok rank=%d world=%d backend=%s\n", ctx.rank(), ctx.world_size(),
                ddp::to_string(ctx.backend()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp-runtime-worker: %s\n", e.what());
    return 1;
  }
}
