#include "output/outer_error_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp/launcher/signal_names.hpp"

namespace ddp::launcher {

std::string error_file_with_code(const std::string& worker_file, int error_code) {
  if (error_code == 0) return worker_file;
  auto json = nlohmann::json::parse(worker_file, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return worker_file;
  auto message = json.find("message");
  if (message == json.end() || !message->is_object()) return worker_file;  // torchrun skips too
  (*message)["errorCode"] = error_code;
  return json.dump();
}

std::string signal_error_file(int pid, int signal, long long unix_seconds) {
  const std::string text =
      "SignalException: Process " + std::to_string(pid) + " got signal: " + std::to_string(signal);
  nlohmann::json json;
  json["message"]["message"] = text;
  json["message"]["extraInfo"]["py_callstack"] =
      "ddprun (pid " + std::to_string(pid) + ") got " + signal_name(signal) +
      ", forwarded it to the workers and stopped\n" + text + "\n";
  json["message"]["extraInfo"]["timestamp"] = std::to_string(unix_seconds);
  return json.dump();
}

std::optional<std::string> write_error_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return std::string(std::strerror(errno));
  return std::nullopt;
}

}  // namespace ddp::launcher
