#pragma once
// NCCL's RAS service (NCCL 2.24+): every NCCL process runs it, and one per node answers
// queries on a TCP port (localhost:28028, or NCCL_RAS_ADDR). Its STATUS report says which
// ranks of each communicator are missing and where collective counts differ across ranks:
// the NCCL side of a hang report. The exchange, as NCCL's own ncclras client does it:
//   -> "CLIENT PROTOCOL 2\n"   <- "SERVER PROTOCOL <n>\n"
//   -> "TIMEOUT <s>\n"         <- "OK\n"          (how long RAS waits for other processes)
//   -> "STATUS\n"              <- the report, in text, until the service closes the connection
// Blocking: call off the agent's loop. Internal to the launcher.

#include <chrono>
#include <string>

namespace ddp::launcher {

inline constexpr const char* kNcclRasDefaultAddress = "localhost:28028";

struct NcclRasStatus {
  bool answered = false;
  std::string report;  // the STATUS text, when answered
  std::string error;   // why not ("connection refused: ...")
};

// Queries the service at address ("host:port"; "[v6]:port" for IPv6) for its STATUS,
// bounded by timeout as a whole. RAS's own wait for other processes is set below it.
NcclRasStatus query_nccl_ras(const std::string& address,
                             std::chrono::milliseconds timeout = std::chrono::seconds(15));

}  // namespace ddp::launcher
