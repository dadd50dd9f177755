#pragma once
// The Python a --run_path worker runs first: it runs the script as Python would, and on an
// uncaught exception writes TORCHELASTIC_ERROR_FILE as torchelastic's @record does, so that the
// failure report shows the traceback. Internal to the launcher.

#include <string_view>

namespace ddp::launcher::detail {

// Source for `python -c`. Its arguments: "--run_path SCRIPT ARGS...". (A -m worker runs
// under the interpreter's own -m, as torchrun's does.)
std::string_view record_wrapper_source();

}  // namespace ddp::launcher::detail
