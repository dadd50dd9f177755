#include "ddp/launcher/log_dir.hpp"

#include <stdlib.h>

#include <cerrno>
#include <system_error>

namespace ddp::launcher {

std::filesystem::path make_run_log_dir(const std::filesystem::path& base,
                                       const std::string& run_id) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(base, ec);
  if (ec) throw std::system_error(ec, "log directory " + base.string());
  std::filesystem::create_directories(absolute, ec);
  if (ec) throw std::system_error(ec, "cannot create the log directory " + absolute.string());
  std::string pattern = (absolute / (run_id + "_XXXXXX")).string();
  if (!::mkdtemp(pattern.data())) {
    throw std::system_error(errno, std::generic_category(),
                            "cannot create a run directory in " + absolute.string());
  }
  return pattern;
}

}  // namespace ddp::launcher
