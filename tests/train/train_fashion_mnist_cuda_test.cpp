// build/bin/train_fashion_mnist --device cuda as users run it, under ddprun. One rank: one GPU
// cannot hold two ranks of one NCCL communicator, so the GPU cases run at world size 1 (the
// Reducer still all-reduces every bucket through NCCL on its stream). Without a CUDA device
// (or in a build without the CUDA trainer) the GPU cases skip with the reason, and the case
// that checks the refusal runs instead.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <regex>
#include <sstream>
#include <vector>

#include "skip.hpp"
#include "test_support.hpp"
#if defined(FMNIST_HAVE_CUDA)
#include "cuda_device.hpp"
#endif

namespace {

constexpr int kTimeoutSeconds = 300;
constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";

// Why the trainer cannot use a GPU here, or "" when it can.
std::string no_gpu_trainer() {
#if defined(FMNIST_HAVE_CUDA)
  return ddp::test::no_cuda_device();
#else
  return "this build has no CUDA trainer (no nvcc)";
#endif
}

bool can_train_on_gpu() {
  if (const std::string why = no_gpu_trainer(); !why.empty()) {
    ddp::test::skip(why);
    return false;
  }
  if (!std::filesystem::exists(std::string(kDataDir) + "/t10k-labels-idx1-ubyte.gz")) {
    ddp::test::skip("dataset-fashion-mnist is not installed (scripts/setup installs it)");
    return false;
  }
  return true;
}

// ddprun --standalone --nproc_per_node=1 [launcher_args] train_fashion_mnist <subset> args
ddp::test::ShellResult train(const std::string& launcher_args, const std::string& args) {
  const std::string command = ddp::test::bin_path("ddprun").string() +
                              " --standalone --nproc_per_node=1 " + launcher_args + " " +
                              ddp::test::bin_path("train_fashion_mnist").string() +
                              " --train_limit 6000 --test_limit 2000 --batch_size 32 " + args;
  return ddp::test::run_shell(command, kTimeoutSeconds);
}

// The last "test accuracy P%" of the output, or -1.
double last_accuracy(const std::string& output) {
  const std::regex re(R"(test accuracy ([0-9.]+)%)");
  double last = -1;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    last = std::stod((*it)[1].str());
  }
  return last;
}

// The losses of "step S loss L" lines (--print_losses), in order.
std::vector<double> step_losses(const std::string& output) {
  const std::regex re(R"(step \d+ loss ([-0-9.e+]+))");
  std::vector<double> losses;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    losses.push_back(std::stod((*it)[1].str()));
  }
  return losses;
}

}  // namespace

TEST_CASE("the device option cuda without a usable GPU says why and exits 2") {
  if (no_gpu_trainer().empty()) return ddp::test::skip("a CUDA device is present");
  const auto result = ddp::test::run_shell(
      ddp::test::bin_path("train_fashion_mnist").string() + " --device cuda", 60);
  INFO(result.output);
  CHECK(result.status == 2);
  CHECK(result.output.find("--device cuda: ") != std::string::npos);
  CHECK(result.output.find("use --device cpu") != std::string::npos);
}

TEST_CASE("one rank trains on the GPU under ddprun to a useful accuracy") {
  if (!can_train_on_gpu()) return;
  const auto result = train("", "--device cuda --epochs 2");
  INFO(result.output);
  REQUIRE(result.status == 0);
  CHECK(result.output.find("epoch 2/2: train loss") != std::string::npos);
  CHECK(last_accuracy(result.output) > 70.0);
}

TEST_CASE("the GPU run follows the CPU run step by step from the same weights and order") {
  if (!can_train_on_gpu()) return;
  const auto cpu = train("", "--device cpu --epochs 1 --print_losses");
  const auto gpu = train("", "--device cuda --epochs 1 --print_losses");
  INFO(cpu.output.substr(0, 2000) << "\n---\n" << gpu.output.substr(0, 2000));
  REQUIRE(cpu.status == 0);
  REQUIRE(gpu.status == 0);
  const auto a = step_losses(cpu.output), b = step_losses(gpu.output);
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() >= 20);
  // Both are FP32 with different summation orders: the first steps agree to rounding; the
  // difference grows slowly as SGD compounds it, so only the first 20 are compared tightly.
  for (std::size_t i = 0; i < 20; ++i) CHECK(b[i] == Approx(a[i]).epsilon(1e-3));
  CHECK(std::abs(last_accuracy(gpu.output) - last_accuracy(cpu.output)) < 2.0);
}

TEST_CASE("a GPU worker killed mid-epoch resumes from its checkpoint") {
  if (!can_train_on_gpu()) return;
  ddp::test::TempDir dir;
  // 6000 images at 32 a step: 188 steps per epoch; step 250 is in epoch 2.
  const auto result = train("--max_restarts=1",
                            "--device cuda --epochs 2 --crash_at_step 250 "
                            "--checkpoint_dir " +
                                dir.path().string());
  INFO(result.output);
  REQUIRE(result.status == 0);
  CHECK(result.output.find("crashing at step 250") != std::string::npos);
  CHECK(result.output.find("(1 epochs done)") != std::string::npos);
  CHECK(result.output.find("epoch 2/2: train loss") != std::string::npos);
}

TEST_CASE("the Reducer overhead hook (skip_allreduce) runs on one GPU rank") {
  if (!can_train_on_gpu()) return;
  const auto result = train("", "--device cuda --epochs 1 --skip_allreduce");
  INFO(result.output);
  REQUIRE(result.status == 0);
  CHECK(last_accuracy(result.output) > 60.0);
}

TEST_CASE("a GPU worker whose communicator is aborted writes its error file and exits") {
  if (!can_train_on_gpu()) return;
  // The communicator is aborted once step 5's gradient all-reduces are queued: the step's
  // wait on them (or the next collective) fails with the reason, the worker writes its error
  // file, frees its device memory and exits, and ddprun's report shows the reason.
  const auto start = std::chrono::steady_clock::now();
  const auto result = train("", "--device cuda --epochs 1 --timeout 120 --abort_at_step 5");
  INFO(result.output);
  CHECK(result.status != 0);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(100));
  CHECK(result.output.find("the NCCL communicator was aborted: test hook: --abort_at_step 5") !=
        std::string::npos);
  // The error file carries the reason into ddprun's failure report.
  CHECK(std::regex_search(result.output,
                          std::regex("message   : [^\\n]*test hook: --abort_at_step 5")));
  CHECK(result.output.find("epoch 1/1: train loss") == std::string::npos);
}
