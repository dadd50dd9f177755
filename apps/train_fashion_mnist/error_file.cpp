#include "error_file.hpp"

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

namespace fmnist {

void write_error_file(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const nlohmann::json data = {{"message",
                                {{"message", message},
                                 {"extraInfo",
                                  {{"py_callstack", "train_fashion_mnist: " + message + "\n"},
                                   {"timestamp", std::to_string(std::time(nullptr))}}}}}};
  std::ofstream(path) << data.dump();
}

}  // namespace fmnist
