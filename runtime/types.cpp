#include "ddp/types.hpp"

namespace ddp {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "unknown op";
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
  }
  return "unknown dtype";
}

const char* to_string(Backend backend) {
  return backend == Backend::Gloo ? "gloo" : "nccl";
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::F16: case DType::BF16: return 2;
  }
  return 0;
}

}  // namespace ddp
