// train_fashion_mnist: data-parallel training of a 784-512-512-10 MLP on Fashion-MNIST with
// libddp. Run it under a launcher:
//   ddprun --standalone --nproc_per_node=2 build/bin/train_fashion_mnist --epochs 3
// This file only parses options into a TrainConfig; trainer.cpp does the work.
#include <CLI/CLI.hpp>
#include <map>

#include "blas_kernels.hpp"
#include "trainer.hpp"

int main(int argc, char** argv) {
  fmnist::reexec_with_better_blas_core(argv);  // first: OpenBLAS's kernels are fixed at load
  fmnist::TrainConfig config;
  CLI::App app{"Data-parallel Fashion-MNIST training with libddp (run under ddprun or torchrun)",
               "train_fashion_mnist"};
  app.option_defaults()->always_capture_default();
  app.add_option("--data", config.data_dir, "Directory with the Fashion-MNIST IDX files");
  app.add_option("--batch_size", config.batch_size, "Images per rank per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", config.lr, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--momentum", config.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_option("--epochs", config.epochs, "Epochs in total (resumed ones count)")
      ->check(CLI::NonNegativeNumber);
  const std::map<std::string, fmnist::Device> devices{
      {"auto", fmnist::Device::Auto}, {"cpu", fmnist::Device::Cpu}, {"cuda", fmnist::Device::Cuda}};
  app.add_option("--device", config.device, "cpu, cuda or auto")
      ->transform(CLI::CheckedTransformer(devices, CLI::ignore_case))
      ->option_text("cpu|cuda|auto (default: auto)");
  app.add_option("--seed", config.seed, "Seed of the initial weights and the data order");
  app.add_option("--checkpoint_dir", config.checkpoint_dir,
                 "Write a checkpoint here every epoch and resume from the newest on start");
  app.add_option("--train_limit", config.train_limit, "Train on the first N images (0: all)");
  app.add_option("--test_limit", config.test_limit, "Test on the first N images (0: all)");
  app.add_option("--threads", config.threads, "BLAS threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--timeout", config.timeout,
                 "Seconds a rank waits for the others in a collective before it fails");
  app.add_flag("--print_losses", config.print_losses, "Rank 0 prints every step's loss");
  app.add_option("--dump_init", config.dump_init,
                 "Write the initial weights (float32, fc1.weight first) to FILE and exit");
  app.add_flag("--skip_allreduce", config.skip_allreduce,
               "Benchmark hook, one rank only: no gradient all-reduce (the Reducer's overhead)")
      ->group("");
  app.add_option("--crash_at_step", config.crash_at_step,
                 "Test hook: the last rank kills itself at this step on the first attempt")
      ->group("");
  app.add_option("--crash_rank", config.crash_rank,
                 "Test hook: the rank --crash_at_step kills (default: the last one)")
      ->group("");
  app.add_option("--abort_at_step", config.abort_at_step,
                 "Test hook: the CUDA trainer aborts its communicator at this step")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  return fmnist::run_training(config);
}
