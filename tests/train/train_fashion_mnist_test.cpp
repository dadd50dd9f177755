// build/bin/train_fashion_mnist as users run it: under ddprun on 2 ranks, on a subset of the
// real data set so that each run takes a few seconds on 2 cores.
#include <catch2/catch.hpp>
#include <filesystem>
#include <regex>

#include "skip.hpp"
#include "test_support.hpp"

namespace {

constexpr int kTimeoutSeconds = 180;
constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";

bool have_data() {
  if (std::filesystem::exists(std::string(kDataDir) + "/t10k-labels-idx1-ubyte.gz")) return true;
  ddp::test::skip("dataset-fashion-mnist is not installed (scripts/setup installs it)");
  return false;
}

// ddprun --standalone --nproc_per_node=2 [launcher_args] train_fashion_mnist <subset> args
ddp::test::ShellResult train(const std::string& launcher_args, const std::string& args) {
  const std::string command = ddp::test::bin_path("ddprun").string() +
                              " --standalone --nproc_per_node=2 " + launcher_args + " " +
                              ddp::test::bin_path("train_fashion_mnist").string() +
                              " --train_limit 6000 --test_limit 2000 --batch_size 32 " + args;
  return ddp::test::run_shell(command, kTimeoutSeconds);
}

// The last "test accuracy P% (c/n)" of the output, or "".
std::string last_accuracy(const std::string& output) {
  const std::regex re(R"(test accuracy ([0-9.]+)% \(\d+/\d+\))");
  std::string last;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    last = it->str();
  }
  return last;
}

double percent(const std::string& accuracy) {
  return std::stod(accuracy.substr(std::string("test accuracy ").size()));
}

}  // namespace

TEST_CASE("2 ranks under ddprun train a subset to a useful accuracy with a summary per epoch") {
  if (!have_data()) return;
  const auto result = train("", "--epochs 2");
  INFO(result.output);
  REQUIRE(result.status == 0);
  CHECK(result.output.find("epoch 1/2: train loss") != std::string::npos);
  CHECK(result.output.find("epoch 2/2: train loss") != std::string::npos);
  const std::string accuracy = last_accuracy(result.output);
  REQUIRE_FALSE(accuracy.empty());
  CHECK(accuracy.find("/2000)") != std::string::npos);  // the whole test subset, once
  CHECK(percent(accuracy) > 70.0);
}

TEST_CASE("a worker killed mid-epoch is restarted and resumes from the last checkpoint") {
  if (!have_data()) return;
  ddp::test::TempDir dir;
  // Reference: 3 epochs without a failure.
  const auto clean = train("", "--epochs 3 --checkpoint_dir " + (dir.path() / "clean").string());
  INFO(clean.output);
  REQUIRE(clean.status == 0);
  // 3000 images per rank at 32 a step: 94 steps per epoch; step 140 is in the middle of epoch 2.
  const auto crashed =
      train("--max_restarts=1",
            "--epochs 3 --crash_at_step 140 --checkpoint_dir " + (dir.path() / "crashed").string());
  INFO(crashed.output);
  REQUIRE(crashed.status == 0);
  CHECK(crashed.output.find("crashing at step 140") != std::string::npos);
  CHECK(crashed.output.find("(1 epochs done)") != std::string::npos);
  CHECK(crashed.output.find("epoch 3/3: train loss") != std::string::npos);
  CHECK(std::filesystem::exists(dir.path() / "crashed" / "epoch_0003.ckpt"));
  // The resumed run replays epoch 2 from the same state in the same order: same accuracy.
  REQUIRE_FALSE(last_accuracy(clean.output).empty());
  CHECK(last_accuracy(crashed.output) == last_accuracy(clean.output));
  // Started again with every epoch done, it trains nothing and says where it resumed.
  const auto again = train("", "--epochs 3 --checkpoint_dir " + (dir.path() / "crashed").string());
  CHECK(again.status == 0);
  CHECK(again.output.find("(3 epochs done)") != std::string::npos);
  CHECK(again.output.find("epoch 3/3: train loss") == std::string::npos);
}

// The "test loss ..., test accuracy ..." part of the summary line of `epoch` (1-based), or "".
std::string evaluation_of(const std::string& output, int epoch) {
  const std::regex re("epoch " + std::to_string(epoch) +
                      R"(/\d+: train loss [0-9.]+, (test loss [0-9.]+, test accuracy [^,]+),)");
  std::smatch m;
  return std::regex_search(output, m, re) ? m[1].str() : "";
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE(
    "under --restart_policy=inplace, rank 1 killed in epoch 2 is replaced in place: no epoch "
    "repeated, no checkpoint read, the uninterrupted run's accuracy") {
  if (!have_data()) return;
  ddp::test::TempDir dir;
  const auto clean = train("", "--epochs 3");
  INFO(clean.output);
  REQUIRE(clean.status == 0);
  // Step 140 is in the middle of epoch 2 (94 steps per epoch); a checkpoint is written after
  // every epoch, which a restart of every worker would read.
  const auto recovered = train("--max_restarts=1 --restart_policy=inplace",
                               "--epochs 3 --crash_at_step 140 --crash_rank 1 --checkpoint_dir " +
                                   (dir.path() / "ckpt").string());
  INFO(recovered.output);
  REQUIRE(recovered.status == 0);
  CHECK(recovered.output.find("rank 1 crashing at step 140") != std::string::npos);
  CHECK(recovered.output.find("ddprun: rank 1 was replaced in place: generation 1 formed") !=
        std::string::npos);
  // Rank 0 kept its process: it says it recovered, and nobody read a checkpoint.
  CHECK(recovered.output.find("rank 0: recovered in place (generation 1); going on from epoch 2") !=
        std::string::npos);
  CHECK(recovered.output.find("resuming from") == std::string::npos);
  CHECK(recovered.output.find("falls back") == std::string::npos);
  for (int epoch = 1; epoch <= 3; ++epoch) {
    const std::string line = "epoch " + std::to_string(epoch) + "/3: train loss";
    CHECK(count_of(recovered.output, line) == 1);
    // The same model after every epoch: the state went on from the highest committed step.
    REQUIRE_FALSE(evaluation_of(clean.output, epoch).empty());
    CHECK(evaluation_of(recovered.output, epoch) == evaluation_of(clean.output, epoch));
  }
}

TEST_CASE("a missing data directory fails every rank with the file and the fix") {
  ddp::test::TempDir dir;
  const auto result = train("", "--data " + dir.path().string());
  INFO(result.output);
  CHECK(result.status != 0);
  CHECK(result.output.find("train-images-idx3-ubyte.gz: file not found") != std::string::npos);
  CHECK(result.output.find("install the Debian package dataset-fashion-mnist") !=
        std::string::npos);
  // The error file carries it into ddprun's failure report.
  CHECK(result.output.find("message   : " + dir.path().string() + "/train-images-idx3-ubyte.gz") !=
        std::string::npos);
}
