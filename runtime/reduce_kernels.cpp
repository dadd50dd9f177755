// Compiled with -O3 (see CMakeLists.txt) so that the loops vectorise; target_clones adds an
// AVX2 build of each function, picked at load time on CPUs that have it.
#include "reduce_kernels.hpp"

#include <algorithm>
#include <bit>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define DDP_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define DDP_KERNEL
#endif

namespace ddp::detail {

namespace {

template <typename T>
struct Sum { static T apply(T x, T y) { return x + y; } };
template <typename T>
struct Min { static T apply(T x, T y) { return std::min(x, y); } };
template <typename T>
struct Max { static T apply(T x, T y) { return std::max(x, y); } };

template <typename T, template <typename> class Op>
void reduce_native(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = Op<T>::apply(x[i], y[i]);
}

// The hot ones get their own AVX2 clone.
DDP_KERNEL void sum_f32(void* c, const void* a, const void* b, std::size_t n) {
  reduce_native<float, Sum>(c, a, b, n);
}
DDP_KERNEL void sum_f64(void* c, const void* a, const void* b, std::size_t n) {
  reduce_native<double, Sum>(c, a, b, n);
}

float to_f(float16 v) { return to_float(v); }
float to_f(bfloat16 v) { return to_float(v); }
template <typename H>
H from_f(float v) {
  if constexpr (std::is_same_v<H, float16>) return to_float16(v);
  else return to_bfloat16(v);
}

template <typename H, template <typename> class Op>
void reduce_half(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<H*>(c);
  const auto* x = static_cast<const H*>(a);
  const auto* y = static_cast<const H*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = from_f<H>(Op<float>::apply(to_f(x[i]), to_f(y[i])));
}

// bf16 <-> fp32 inline and branch-free (a select for NaN), so that the loops vectorise.
inline float bf16_to_f32(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}
inline std::uint16_t f32_to_bf16(float f) {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(nan ? ((bits >> 16) | 0x40u) : (rounded >> 16));
}

DDP_KERNEL void sum_bf16(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(c);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

DDP_KERNEL void narrow_bf16(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}

DDP_KERNEL void widen_bf16(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

template <template <typename> class Op>
ReduceFn pick(DType dtype) {
  switch (dtype) {
    case DType::F32: return &reduce_native<float, Op>;
    case DType::F64: return &reduce_native<double, Op>;
    case DType::I32: return &reduce_native<std::int32_t, Op>;
    case DType::I64: return &reduce_native<std::int64_t, Op>;
    case DType::F16: return &reduce_half<float16, Op>;
    case DType::BF16: return &reduce_half<bfloat16, Op>;
  }
  return nullptr;
}

DDP_KERNEL void divide_f32(float* data, std::size_t n, float divisor) {
  for (std::size_t i = 0; i < n; ++i) data[i] = data[i] / divisor;
}
DDP_KERNEL void divide_f64(double* data, std::size_t n, double divisor) {
  for (std::size_t i = 0; i < n; ++i) data[i] = data[i] / divisor;
}

template <typename T>
void divide_int(T* data, std::size_t n, T divisor) {
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / divisor);
}

template <typename H>
void divide_half(H* data, std::size_t n, float divisor) {
  for (std::size_t i = 0; i < n; ++i) data[i] = from_f<H>(to_f(data[i]) / divisor);
}

}  // namespace

ReduceFn reduce_function(DType dtype, ReduceOp op) {
  if (op == ReduceOp::Min) return pick<Min>(dtype);
  if (op == ReduceOp::Max) return pick<Max>(dtype);
  if (dtype == DType::F32) return &sum_f32;
  if (dtype == DType::F64) return &sum_f64;
  if (dtype == DType::BF16) return &sum_bf16;
  return pick<Sum>(dtype);
}

void divide(void* data, std::size_t n, DType dtype, int divisor) {
  switch (dtype) {
    case DType::F32: return divide_f32(static_cast<float*>(data), n, static_cast<float>(divisor));
    case DType::F64: return divide_f64(static_cast<double*>(data), n, divisor);
    case DType::I32: return divide_int(static_cast<std::int32_t*>(data), n, divisor);
    case DType::I64: return divide_int<std::int64_t>(static_cast<std::int64_t*>(data), n, divisor);
    case DType::F16: return divide_half(static_cast<float16*>(data), n, static_cast<float>(divisor));
    case DType::BF16: return divide_half(static_cast<bfloat16*>(data), n, static_cast<float>(divisor));
  }
}

void narrow(const float* in, void* out, std::size_t n, DType wire) {
  if (wire == DType::F16) {
    auto* o = static_cast<float16*>(out);
    for (std::size_t i = 0; i < n; ++i) o[i] = to_float16(in[i]);
  } else {
    narrow_bf16(in, static_cast<std::uint16_t*>(out), n);
  }
}

void widen(const void* in, float* out, std::size_t n, DType wire) {
  if (wire == DType::F16) {
    const auto* h = static_cast<const float16*>(in);
    for (std::size_t i = 0; i < n; ++i) out[i] = to_float(h[i]);
  } else {
    widen_bf16(static_cast<const std::uint16_t*>(in), out, n);
  }
}

}  // namespace ddp::detail
