#pragma once
// Element-wise kernels of the Gloo backend (reductions, averaging, 16-bit conversion),
// vectorised and built for AVX2 with a plain x86-64 fallback chosen at load time. They sit
// on the communication thread's critical path: Gloo calls the reduction for every segment.

#include <cstddef>
#include <cstdint>

#include "ddp/half.hpp"
#include "ddp/types.hpp"

namespace ddp::detail {

// Gloo's reduction signature: c[i] = a[i] (op) b[i] for n elements; c may equal a or b.
using ReduceFn = void (*)(void* c, const void* a, const void* b, std::size_t n);

// The reduction for dtype and op (Avg reduces as Sum; divide afterwards).
ReduceFn reduce_function(DType dtype, ReduceOp op);

// data[i] /= divisor in the element type (integers truncate; 16-bit types through float).
void divide(void* data, std::size_t n, DType dtype, int divisor);

// fp32 <-> 16-bit conversion for compressed all-reduce.
void narrow(const float* in, void* out, std::size_t n, DType wire);
void widen(const void* in, float* out, std::size_t n, DType wire);

}  // namespace ddp::detail
