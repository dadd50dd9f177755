#pragma once
// CUDA kernels of the NCCL backend's 16-bit gradient compression: f32 narrowed into a wire
// buffer of f16 or bf16, and widened back; and the guard that poisons an aborted step. Built only
// when nvcc is found (DDP_HAVE_CUDA_KERNELS); plain C++ header so that C++20 sources can include
// it.

#include <cuda_runtime.h>

#include <cstddef>

namespace ddp::detail {

enum class WireType { F16, BF16 };

// Queues on `stream`: wire[i] = 16-bit(src[i] * scale), rounding to nearest even. Returns
// the launch's status (cudaSuccess when count is 0).
cudaError_t narrow_on_stream(const float* src, void* wire, std::size_t count, WireType type,
                             float scale, cudaStream_t stream);

// Queues on `stream`: dst[i] = float(wire[i]) * scale.
cudaError_t widen_on_stream(const void* wire, float* dst, std::size_t count, WireType type,
                            float scale, cudaStream_t stream);

// Queues on `stream`: when *abort_flag (host memory mapped into the device, written by the
// host when the communicator is aborted) is nonzero as the kernel runs, data[0..count) = NaN:
// the results of an aborted collective never reach an optimizer as numbers.
cudaError_t poison_if_aborted_on_stream(const int* abort_flag, float* data, std::size_t count,
                                        cudaStream_t stream);

}  // namespace ddp::detail
