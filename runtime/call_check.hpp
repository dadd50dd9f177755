#pragma once
// Detecting mismatched collectives: each rank's view of a call, compared across ranks.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/communicator.hpp"

namespace ddp::detail {

enum class CallKind : std::int64_t { Allreduce, Broadcast, Allgather, ReduceScatter, Barrier };

// What one rank asked for.
struct CallDescriptor {
  CallKind kind = CallKind::Barrier;
  DType dtype = DType::F32;
  std::uint64_t count = 0;  // elements (per rank for allgather / reduce_scatter)
  std::int64_t detail = 0;  // the ReduceOp, or the broadcast root

  std::string str() const;  // "allreduce(sum, f32 x 1000)"
  using Wire = std::array<std::int64_t, 4>;
  Wire encode() const;
  static CallDescriptor decode(const Wire& wire);
  bool operator==(const CallDescriptor&) const = default;
};

// Throws CollectiveMismatch listing every rank's view when they differ. `views[r]` is rank
// r's descriptor; `rank` is the caller's.
void check_same_call(const std::vector<CallDescriptor>& views, int rank);

// Decides, call by call, whether the next call is compared.
class MismatchPolicy {
 public:
  explicit MismatchPolicy(MismatchCheck check) : check_(check) {}
  void set(MismatchCheck check) { check_ = check; }
  // True when this call should be compared; counts the call.
  bool next() {
    bool first = calls_++ == 0;
    return check_ == MismatchCheck::Always || (check_ == MismatchCheck::FirstCall && first);
  }

 private:
  MismatchCheck check_;
  std::uint64_t calls_ = 0;
};

}  // namespace ddp::detail
