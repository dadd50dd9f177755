// ddp-reducer-bench: a synthetic backward (one sgemm per parameter, ResNet-50's parameter
// sizes) on every rank, timed three ways: compute alone, compute with the Reducer
// overlapping the all-reduce, and compute followed by one all-reduce of everything.
// Exposed communication = step - compute. Run it under ddprun; scripts/bench-reducer runs
// it beside PyTorch DDP on the same layers. With --record it also times the Reducer on a
// second Context that records its collectives into a record page (docs/runtime.md), made
// here as the agent would, against the first one that records nothing.
//   ddprun --nproc_per_node=2 build/bin/ddp-reducer-bench --steps 10 [--record]
#include <cblas.h>
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collective_recorder.hpp"  // libddp's internal recorder: its cost per call
#include "ddp/common/collective_record.hpp"
#include "ddp/runtime.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct BenchConfig {
  int steps = 10;              // timed steps per mode
  int warmup = 2;              // untimed steps per mode
  int tokens = 32;             // M: columns of each layer's sgemm (compute per parameter)
  double first_bucket_mb = 1;  // the Reducer's first bucket cap
  double bucket_cap_mb = 25;   // the Reducer's later bucket caps
  bool print_layers = false;   // print "rows cols" per parameter and exit (for the DDP side)
  bool record = false;         // also time the Reducer with the collective record on
  bool no_record = false;      // record nothing, even in the page ddprun gives each worker
};

// One parameter as a matrix: rows x cols (conv weights flattened to out x in*kh*kw).
struct Layer {
  int rows;
  int cols;
  std::size_t size() const { return static_cast<std::size_t>(rows) * cols; }
};

// ResNet-50's parameters in torchvision's registration order (161 tensors, 25.6 M floats).
std::vector<Layer> resnet50_layers() {
  std::vector<Layer> layers;
  auto conv = [&](int out, int in, int k) { layers.push_back({out, in * k * k}); };
  auto bn = [&](int c) {
    layers.push_back({c, 1});
    layers.push_back({c, 1});
  };
  conv(64, 3, 7);
  bn(64);
  int in = 64;
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int width = 64 << stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      conv(width, in, 1);
      bn(width);
      conv(width, width, 3);
      bn(width);
      conv(width * 4, width, 1);
      bn(width * 4);
      if (b == 0) {
        conv(width * 4, in, 1);
        bn(width * 4);
      }
      in = width * 4;
    }
  }
  layers.push_back({1000, 2048});  // fc.weight
  layers.push_back({1000, 1});     // fc.bias
  return layers;
}

// The per-layer backward: grad (rows x cols) = dY (rows x M) * X^T (M x cols), written
// straight into the gradient buffer.
class SyntheticBackward {
 public:
  SyntheticBackward(const std::vector<Layer>& layers, int tokens)
      : layers_(layers), tokens_(tokens) {
    int max_rows = 1, max_cols = 1;
    for (const auto& l : layers) {
      max_rows = std::max(max_rows, l.rows);
      max_cols = std::max(max_cols, l.cols);
    }
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    dy_.resize(static_cast<std::size_t>(max_rows) * tokens);
    x_.resize(static_cast<std::size_t>(max_cols) * tokens);
    for (auto& v : dy_) v = dist(rng);
    for (auto& v : x_) v = dist(rng);
  }
  void layer(std::size_t i, float* grad) const {
    const Layer& l = layers_[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, l.rows, l.cols, tokens_, 1.0f, dy_.data(),
                tokens_, x_.data(), tokens_, 0.0f, grad, l.cols);
  }

 private:
  const std::vector<Layer>& layers_;
  int tokens_;
  std::vector<float> dy_, x_;
};

// A zeroed collective record page in a memfd, as the agent makes one, mapped for reading.
class RecordPage {
 public:
  RecordPage() {
    fd_ = memfd_create("ddp-reducer-bench-record", MFD_CLOEXEC);
    if (fd_ < 0 || ftruncate(fd_, sizeof(ddp::record::RecordPage)) != 0) {
      throw std::runtime_error("could not make a memfd record page");
    }
    void* mapped = mmap(nullptr, sizeof(ddp::record::RecordPage), PROT_READ, MAP_SHARED, fd_, 0);
    if (mapped == MAP_FAILED) throw std::runtime_error("could not map the record page");
    page_ = static_cast<const ddp::record::RecordPage*>(mapped);
  }
  ~RecordPage() {
    munmap(const_cast<ddp::record::RecordPage*>(page_), sizeof(ddp::record::RecordPage));
    close(fd_);
  }
  RecordPage(const RecordPage&) = delete;
  RecordPage& operator=(const RecordPage&) = delete;
  int fd() const { return fd_; }
  const ddp::record::RecordPage& page() const { return *page_; }

 private:
  int fd_ = -1;
  const ddp::record::RecordPage* page_ = nullptr;
};

// The recorder's own cost, without communication: ns per collective (queued, started,
// finished) and per Reducer step (begin, ready, finalized), over a page of its own.
std::pair<double, double> record_cost_ns(int rank, int world_size) {
  RecordPage page;
  auto recorder =
      ddp::detail::CollectiveRecorder::attach(page.fd(), rank, world_size, ddp::Backend::Gloo);
  if (!recorder) throw std::runtime_error("could not attach a recorder to a fresh page");
  constexpr int kCalls = 200000;
  const auto word = ddp::detail::CollectiveRecorder::dtype_word(ddp::DType::F32);
  auto start = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    const auto seq = recorder->on_queued(ddp::record::Op::kAllReduce, word, 1000, 4000, i % 5);
    recorder->on_started(seq);
    recorder->on_finished(seq, false);
  }
  const double collective =
      std::chrono::duration<double, std::nano>(Clock::now() - start).count() / kCalls;
  start = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    recorder->step_begin();
    recorder->step_ready();
    recorder->step_finalized();
  }
  const double step =
      std::chrono::duration<double, std::nano>(Clock::now() - start).count() / kCalls;
  return {collective, step};
}

// Median of this rank's step times, then the largest over ranks (the job's pace).
double job_median_ms(ddp::Context& ctx, std::vector<double> times) {
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  ctx.allreduce(std::span<double>(&median, 1), ddp::ReduceOp::Max);
  return median;
}

// Runs the modes round-robin, one step each, so that a change in machine load hits every
// mode alike; returns each mode's job median.
std::vector<double> time_modes(ddp::Context& ctx, const BenchConfig& config,
                               const std::vector<std::function<void()>>& modes) {
  std::vector<std::vector<double>> times(modes.size());
  for (int s = 0; s < config.warmup + config.steps; ++s) {
    for (std::size_t m = 0; m < modes.size(); ++m) {
      ctx.barrier();
      const auto start = Clock::now();
      modes[m]();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (s >= config.warmup) times[m].push_back(ms);
    }
  }
  std::vector<double> medians;
  for (auto& t : times) medians.push_back(job_median_ms(ctx, t));
  return medians;
}

int run(const BenchConfig& config) {
  const auto layers = resnet50_layers();
  if (config.print_layers) {
    for (const auto& l : layers) std::printf("%d %d\n", l.rows, l.cols);
    return 0;
  }
  openblas_set_num_threads(1);  // one compute thread per rank, as torch.set_num_threads(1)
  ddp::InitOptions init_options;
  // Against a recording Context, the baseline records nothing, whatever the launcher set.
  if (config.record || config.no_record) init_options.record_fd = -1;
  ddp::Context ctx = ddp::init(init_options);
  ddp::Logger log(ctx, false, stdout);
  std::size_t total = 0;
  for (const auto& l : layers) total += l.size();
  std::vector<float> params(total, 0.01f);
  std::vector<ddp::Parameter> parameters;
  std::vector<std::size_t> offsets;
  for (std::size_t i = 0, off = 0; i < layers.size(); off += layers[i].size(), ++i) {
    offsets.push_back(off);
    parameters.push_back(
        {"layer" + std::to_string(i), std::span<float>(params).subspan(off, layers[i].size())});
  }
  SyntheticBackward backward(layers, config.tokens);
  std::vector<float> flat(total);  // compute-only and one-all-reduce modes write here

  ddp::ReducerOptions options;
  options.first_bucket_mb = config.first_bucket_mb;
  options.bucket_cap_mb = config.bucket_cap_mb;
  ddp::Reducer reducer(ctx, parameters, options);
  // The same Reducer on a second Context of the same world that records its collectives.
  std::optional<RecordPage> record_page;
  std::optional<ddp::Context> recorded_ctx;
  std::optional<ddp::Reducer> recorded;
  if (config.record) {
    record_page.emplace();
    ddp::InitOptions recording = init_options;
    recording.record_fd = record_page->fd();
    recorded_ctx.emplace(ddp::init(ctx.env(), ctx.shared_store(), recording));
    ddp::ReducerOptions plain = options;
    plain.broadcast_parameters = false;
    recorded.emplace(*recorded_ctx, parameters, plain);
  }
  options.compression = ddp::DType::BF16;
  options.broadcast_parameters = false;  // already equal
  ddp::Reducer compressed(ctx, parameters, options);
  std::vector<std::function<void()>> modes = {
      [&] {  // compute alone
        for (std::size_t i = layers.size(); i-- > 0;) backward.layer(i, flat.data() + offsets[i]);
      },
      [&] {  // compute, then one all-reduce of everything
        for (std::size_t i = layers.size(); i-- > 0;) backward.layer(i, flat.data() + offsets[i]);
        ctx.allreduce(std::span<float>(flat), ddp::ReduceOp::Avg);
      },
      [&] {  // compute with the Reducer overlapping the all-reduces
        for (std::size_t i = layers.size(); i-- > 0;) {
          backward.layer(i, reducer.grad(i).data());
          reducer.mark_ready(i);
        }
        reducer.finalize();
      },
      [&] {  // the same, all-reducing in bf16
        for (std::size_t i = layers.size(); i-- > 0;) {
          backward.layer(i, compressed.grad(i).data());
          compressed.mark_ready(i);
        }
        compressed.finalize();
      }};
  if (config.record) {
    modes.push_back([&] {  // the Reducer mode again, recording its collectives and steps
      for (std::size_t i = layers.size(); i-- > 0;) {
        backward.layer(i, recorded->grad(i).data());
        recorded->mark_ready(i);
      }
      recorded->finalize();
    });
  }
  const auto medians = time_modes(ctx, config, modes);
  const double compute = medians[0], one_allreduce = medians[1], with_reducer = medians[2];
  const double with_bf16 = medians[3];
  std::string record_fields;
  if (config.record) {
    const double with_record = medians[4];
    record_fields =
        ", \"overlapped_recorded_ms\": " + std::to_string(with_record) +
        ", \"record_overhead_pct\": " +
        std::to_string((with_record - with_reducer) / with_reducer * 100.0) +
        ", \"recorded_collectives\": " + std::to_string(record_page->page().finished.load()) +
        ", \"recorded_steps\": " + std::to_string(record_page->page().steps.load());
    // What recording adds to a step by its own cost: a record per bucket all-reduce and the
    // step marks, against the step without recording.
    const auto [collective_ns, step_ns] = record_cost_ns(ctx.rank(), ctx.world_size());
    const double per_step_ns =
        collective_ns * static_cast<double>(reducer.buckets().size()) + step_ns;
    record_fields +=
        ", \"record_ns_per_collective\": " + std::to_string(collective_ns) +
        ", \"record_ns_per_step_marks\": " + std::to_string(step_ns) +
        ", \"record_cost_pct\": " + std::to_string(per_step_ns / (with_reducer * 1e6) * 100.0);
  }
  log.info("{\"impl\": \"ddp\", \"world\": ", ctx.world_size(), ", \"params\": ", total,
           ", \"buckets\": ", reducer.buckets().size(), ", \"tokens\": ", config.tokens,
           ", \"compute_ms\": ", compute, ", \"one_allreduce_ms\": ", one_allreduce,
           ", \"overlapped_ms\": ", with_reducer,
           ", \"exposed_one_allreduce_ms\": ", one_allreduce - compute,
           ", \"exposed_overlapped_ms\": ", with_reducer - compute,
           ", \"overlapped_compressed_ms\": ", with_bf16,
           ", \"exposed_overlapped_compressed_ms\": ", with_bf16 - compute, record_fields, "}");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchConfig config;
  CLI::App app("ddp-reducer-bench: exposed gradient communication with ddp::Reducer");
  app.add_option("--steps", config.steps, "Timed steps per mode")->check(CLI::PositiveNumber);
  app.add_option("--warmup", config.warmup, "Untimed steps per mode");
  app.add_option("--tokens", config.tokens, "Columns of each layer's sgemm")
      ->check(CLI::PositiveNumber);
  app.add_option("--first_bucket_mb", config.first_bucket_mb, "First bucket cap (MiB)");
  app.add_option("--bucket_cap_mb", config.bucket_cap_mb, "Later bucket caps (MiB)");
  app.add_flag("--print_layers", config.print_layers, "Print each parameter's rows and cols");
  app.add_flag("--record", config.record,
               "Also time the Reducer with the collective record on (against off)");
  app.add_flag("--no_record", config.no_record,
               "Record no collective (ddprun gives every worker a record page: on by default)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp-reducer-bench: %s\n", e.what());
    return 1;
  }
}
