#include "process/record_wrapper.hpp"

#include "record_wrapper_source.hpp"  // generated from worker/python/embedded/record_wrapper.py

namespace ddp::launcher::detail {

// As torchelastic's ErrorHandler.record_exception: {"message": {"message": "Type: text",
// "extraInfo": {"py_callstack": <traceback>, "timestamp": "<unix seconds>"}}}, written only
// when TORCHELASTIC_ERROR_FILE is set, then the exception goes on (exit status 1 and the
// traceback on stderr). SystemExit and KeyboardInterrupt are not errors to record.
// sys.argv and sys.path[0] are what `python SCRIPT` / `python -m MODULE` would have set.
std::string_view record_wrapper_source() { return kRecordWrapperSource; }

}  // namespace ddp::launcher::detail
