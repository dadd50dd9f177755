#pragma once
// Training checkpoints: the epochs finished, the parameters and the optimizer's momentum
// buffers, in one file per epoch (epoch_0003.ckpt) under a directory.
//
// Files are written atomically (a temporary file in the same directory, fsync, rename,
// fsync of the directory), so a crash leaves either the previous newest checkpoint or the
// new one, never a torn file; a checksum catches any other damage. The two newest are kept.
//
// Format (little-endian): "FMNISTCK", u32 version (1), u32 epochs_done, u32 tensor count,
// then per tensor u64 element count and the floats, then u64 FNV-1a of everything before.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

namespace fmnist {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Checkpoint {
  std::uint32_t epochs_done = 0;
  std::vector<std::vector<float>> tensors;  // parameters, then momentum buffers
};

// Writes dir/epoch_NNNN.ckpt atomically (creating dir), then removes all but the two newest.
// Returns the file's path. CheckpointError naming the path when a step fails.
std::filesystem::path write_checkpoint(const std::filesystem::path& dir, std::uint32_t epochs_done,
                                       const std::vector<std::span<const float>>& tensors);

// Reads and verifies a checkpoint; CheckpointError when it is truncated, damaged, or its
// tensors' sizes differ from expected_sizes (a checkpoint of another model).
Checkpoint read_checkpoint(const std::filesystem::path& path,
                           const std::vector<std::size_t>& expected_sizes);

// The checkpoint files in dir, newest (most epochs) first; empty when dir does not exist.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir);

}  // namespace fmnist
