#include "ddp/logger.hpp"

#include "ddp/context.hpp"

namespace ddp {

Logger::Logger(const Context& context, bool all_ranks, std::FILE* out)
    : Logger(context.rank(), all_ranks, out) {}

void Logger::write(std::string_view message) const {
  std::string line = "[rank " + std::to_string(rank_) + "] ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

}  // namespace ddp
