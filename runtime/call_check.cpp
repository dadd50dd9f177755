#include "call_check.hpp"

namespace ddp::detail {

namespace {

const char* kind_name(CallKind kind) {
  switch (kind) {
    case CallKind::Allreduce: return "allreduce";
    case CallKind::Broadcast: return "broadcast";
    case CallKind::Allgather: return "allgather";
    case CallKind::ReduceScatter: return "reduce_scatter";
    case CallKind::Barrier: return "barrier";
  }
  return "unknown collective";
}

}  // namespace

std::string CallDescriptor::str() const {
  std::string s = kind_name(kind);
  if (kind == CallKind::Barrier) return s + "()";
  s += "(";
  if (kind == CallKind::Allreduce || kind == CallKind::ReduceScatter) {
    s += to_string(static_cast<ReduceOp>(detail));
    s += ", ";
  } else if (kind == CallKind::Broadcast) {
    s += "root " + std::to_string(detail) + ", ";
  }
  return s + to_string(dtype) + " x " + std::to_string(count) + ")";
}

CallDescriptor::Wire CallDescriptor::encode() const {
  return {static_cast<std::int64_t>(kind), static_cast<std::int64_t>(dtype),
          static_cast<std::int64_t>(count), detail};
}

CallDescriptor CallDescriptor::decode(const Wire& wire) {
  return {static_cast<CallKind>(wire[0]), static_cast<DType>(wire[1]),
          static_cast<std::uint64_t>(wire[2]), wire[3]};
}

void check_same_call(const std::vector<CallDescriptor>& views, int rank) {
  bool same = true;
  for (const auto& view : views) same = same && view == views.front();
  if (same) return;
  std::string message = "rank " + std::to_string(rank) +
                        ": ranks issued different collectives:";
  for (std::size_t r = 0; r < views.size(); ++r) {
    message += "\n  rank " + std::to_string(r) + ": " + views[r].str();
  }
  throw CollectiveMismatch(message);
}

}  // namespace ddp::detail
