#pragma once
// Element types, reduction operations and the error types of libddp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ddp/half.hpp"

namespace ddp {

// How long a collective may take before its wait fails (PyTorch's default is 30 minutes; a
// training step that needs more than this is stuck, not slow).
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::minutes(10);

enum class ReduceOp { Sum, Avg, Min, Max };

enum class DType { F32, F64, I32, I64, F16, BF16 };

enum class Backend { Gloo, Nccl };

const char* to_string(ReduceOp op);
const char* to_string(DType dtype);
const char* to_string(Backend backend);
std::size_t size_of(DType dtype);

// dtype_of<T>: the DType of an element type usable in collectives.
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<std::int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<float16> { static constexpr DType value = DType::F16; };
template <> struct DTypeOf<bfloat16> { static constexpr DType value = DType::BF16; };

template <typename T>
concept Element = requires { DTypeOf<T>::value; };

template <Element T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// Every libddp failure derives from Error; what() names the rank, the operation and, where
// one applies, the store endpoint or key.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The launcher's environment is missing or malformed (names the variable).
class EnvError : public Error {
 public:
  using Error::Error;
};

// Building the communicator failed: the store, the transport or the backend.
class InitError : public Error {
 public:
  using Error::Error;
};

// A collective failed or timed out in the backend.
class CommError : public Error {
 public:
  using Error::Error;
};

// Ranks called different collectives (operation, dtype or count); what() shows every view.
class CollectiveMismatch : public CommError {
 public:
  using CommError::CommError;
};

// The backend does not offer this operation or dtype.
class Unsupported : public Error {
 public:
  using Error::Error;
};

// The Reducer was used out of contract (a buffer marked twice, finalize with buffers never
// marked, a different bucket layout across ranks); what() names the buffers.
class ReducerError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddp
