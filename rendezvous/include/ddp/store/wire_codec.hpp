#pragma once
// The c10d TCPStore wire format (both dialects): command tables, incremental request and
// reply parsers and the encoders for requests and replies. Pure functions and objects, no sockets:
// the server, the client, the benchmarks and the fuzzer all share this file.
//
// Facts: PyTorch's torch/csrc/distributed/c10d/TCPStore*.cpp (1.13 and 2.x), summed up in
// docs/store.md "What it serves". Every length read from the wire is checked against
// Limits before anything is allocated for it, and strings grow only as their bytes arrive.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

// PyTorch 1.x (1.13: no handshake, WATCH_KEY) or 2.x (VALIDATE first, more commands).
enum class Dialect : std::uint8_t { V1, V2 };

// "1.x" / "2.x"
std::string_view dialect_name(Dialect dialect);

// Every command of both tables, independent of its byte value in a dialect.
enum class Command : std::uint8_t {
  Validate,
  Set,
  CompareSet,
  Get,
  Add,
  Check,
  Wait,
  GetNumKeys,
  WatchKey,
  DeleteKey,
  Append,
  MultiGet,
  MultiSet,
  CancelWait,
  Ping,
  QueuePush,
  QueuePop,
  QueueLen,
};

std::string_view command_name(Command command);

// The command a byte stands for in a dialect; nullopt when the dialect has no such command.
std::optional<Command> decode_command(Dialect dialect, std::uint8_t byte);

// The byte of a command in a dialect; nullopt when the dialect lacks the command.
std::optional<std::uint8_t> encode_command(Dialect dialect, Command command);

// The magic a 2.x client sends with VALIDATE (00 CE F7 85 3C on the wire).
inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;

// Reply codes.
inline constexpr std::uint8_t kCheckReady = 0;
inline constexpr std::uint8_t kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;
// 1.x WATCH_KEY events.
inline constexpr std::uint8_t kWatchKeyUpdated = 0;
inline constexpr std::uint8_t kWatchKeyCreated = 1;
inline constexpr std::uint8_t kWatchKeyDeleted = 2;
inline constexpr std::uint8_t kWatchCallbackRegistered = 3;

// What one request may carry. The defaults are PyTorch's (2.x libuv server) limits; the
// total bounds a request of many keys or values.
struct Limits {
  std::size_t max_key_bytes = 8 * 1024;              // one key
  std::size_t max_value_bytes = 8 * 1024 * 1024;     // one value
  std::size_t max_keys_per_request = 128 * 1024;     // CHECK/WAIT/MULTI_GET/MULTI_SET count
  std::size_t max_request_bytes = 64 * 1024 * 1024;  // everything in one request
  std::size_t max_reply_bytes = 64 * 1024 * 1024;    // everything in one MULTI_GET reply
};

// One decoded request. Reused from request to request: keys/values hold `key_count` /
// `value_count` valid entries, so their capacity is kept between requests.
struct Request {
  Command command = Command::GetNumKeys;
  std::vector<std::string> keys;  // SET/GET/...: 1 key; CHECK/WAIT/MULTI_*: n keys
  std::vector<std::string>
      values;  // SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: expected, desired; MULTI_SET: n
  std::size_t key_count = 0;
  std::size_t value_count = 0;
  std::int64_t delta = 0;  // ADD
  std::uint32_t u32 = 0;   // VALIDATE magic, PING nonce

  std::string_view key(std::size_t i = 0) const { return keys[i]; }
  std::string_view value(std::size_t i = 0) const { return values[i]; }
};

// Reassembles requests from bytes as they arrive, in any fragmentation. Feed it what the
// socket gave; it stops after each complete request so the caller can act on it before the
// next one. With no dialect given, it tells 1.x from 2.x by the first bytes (2.x opens with
// VALIDATE + magic).
class RequestParser {
 public:
  enum class Status { NeedMore, Complete, Error };
  struct Result {
    Status status;
    std::size_t consumed;  // bytes of the input used (the rest belongs to later requests)
  };

  explicit RequestParser(Limits limits = {}, std::optional<Dialect> dialect = std::nullopt);

  // Consumes bytes until a request is complete, more bytes are needed, or the input is
  // invalid. After Complete, request() holds it until the next feed(). After Error, error()
  // says why and every later feed() fails again.
  Result feed(std::string_view data);

  const Request& request() const { return request_; }
  Request& request() { return request_; }
  const std::string& error() const { return error_; }
  std::optional<Dialect> dialect() const { return dialect_; }
  // True when no byte of a next request has arrived yet.
  bool idle() const { return step_ == Step::Command && !sniffing_; }

  // Drops spare capacity kept from large requests (keeps the parser's footprint small).
  void trim();

 private:
  enum class Step : std::uint8_t { Command, Fixed, Length, Body, Done };
  enum class Field : std::uint8_t { None, U32, I64, Count, Key, Value };

  Result fail(std::string reason, std::size_t consumed);
  bool sniff(std::string_view data, std::size_t& used, std::uint8_t& replay_count);
  bool start_command(std::uint8_t byte);
  Field next_field() const;
  bool begin_field();
  bool finish_fixed();
  bool finish_length();
  std::string& body_target();

  Limits limits_;
  std::optional<Dialect> dialect_;
  bool sniffing_;
  std::uint8_t sniffed_ = 0;  // bytes of the 2.x opening matched so far
  Request request_;
  Step step_ = Step::Command;
  Field field_ = Field::None;
  std::uint64_t count_ = 0;  // announced keys (or pairs) of CHECK/WAIT/MULTI_*
  std::size_t fields_done_ = 0;
  unsigned char scratch_[8] = {};
  std::size_t scratch_have_ = 0;
  std::size_t scratch_need_ = 0;
  std::uint64_t body_left_ = 0;
  std::uint64_t request_bytes_ = 0;
  std::string error_;
};

// One decoded reply. Which fields are set depends on the command it answers.
struct Reply {
  std::int64_t number = 0;  // ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN; QUEUE_POP's length
  std::uint8_t code = 0;    // CHECK, WAIT, CANCEL_WAIT, WATCH_KEY
  std::uint32_t u32 = 0;    // PING's nonce
  std::vector<std::string>
      values;  // GET, COMPARE_SET: 1; MULTI_GET: one per key; QUEUE_POP: 0 or 1
};

// False for the commands the server never answers (VALIDATE, SET, APPEND, MULTI_SET,
// QUEUE_PUSH).
bool has_reply(Command command);

// Reassembles the reply to one request from bytes as they arrive, in any fragmentation.
// Call expect() with the request's command before feeding its reply. Every length is checked
// against Limits (max_value_bytes per value, max_reply_bytes in all) before anything is
// allocated for it.
class ReplyParser {
 public:
  enum class Status { NeedMore, Complete, Error };
  struct Result {
    Status status;
    std::size_t consumed;  // bytes of the input used (the rest is not part of this reply)
  };

  explicit ReplyParser(Limits limits = {}) : limits_(limits) {}

  // Starts the reply to command; key_count: the keys of a MULTI_GET. Clears any error.
  void expect(Command command, std::size_t key_count = 0);
  // Consumes bytes until the reply is complete, more are needed, or it is invalid (error()
  // says why). A command without a reply is complete at once.
  Result feed(std::string_view data);

  Reply& reply() { return reply_; }
  const std::string& error() const { return error_; }

 private:
  enum class Field : std::uint8_t { None, U8, U32, I64, Length };

  Field next_field() const;
  void begin_field();
  bool finish_fixed();

  Limits limits_;
  Command command_ = Command::Set;
  std::size_t key_count_ = 0;
  Reply reply_;
  Field field_ = Field::None;
  std::size_t fields_done_ = 0;
  bool in_body_ = false;
  std::uint64_t body_left_ = 0;
  std::uint64_t reply_bytes_ = 0;
  unsigned char scratch_[8] = {};
  std::size_t scratch_have_ = 0;
  std::size_t scratch_need_ = 0;
  std::string error_;
};

// Little-endian encoders, appending to out.
void put_u8(std::string& out, std::uint8_t v);
void put_u32(std::string& out, std::uint32_t v);
void put_u64(std::string& out, std::uint64_t v);
void put_i64(std::string& out, std::int64_t v);
// u64 length, then the bytes.
void put_bytes(std::string& out, std::string_view bytes);

std::uint32_t get_u32(const char* p);
std::uint64_t get_u64(const char* p);
std::int64_t get_i64(const char* p);

// Appends the request's command byte and fields in the dialect's encoding. Throws
// std::invalid_argument when the dialect lacks the command.
void encode_request(Dialect dialect, const Request& request, std::string& out);

// Builds a Request (for clients, tests and the fuzzer).
Request make_request(Command command, std::vector<std::string> keys = {},
                     std::vector<std::string> values = {}, std::int64_t delta = 0,
                     std::uint32_t u32 = 0);

}  // namespace ddp::store
