#include "ddp/store/wire_codec.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>

namespace ddp::store {
namespace {

using enum Command;

// Index = byte value.
constexpr std::array<Command, 9> kV1Table = {Set,  CompareSet, Get,      Add,      Check,
                                             Wait, GetNumKeys, WatchKey, DeleteKey};
constexpr std::array<Command, 17> kV2Table = {
    Validate, Set,      CompareSet, Get,        Add,  Check,     Wait,     GetNumKeys, DeleteKey,
    Append,   MultiGet, MultiSet,   CancelWait, Ping, QueuePush, QueuePop, QueueLen};

// The 2.x opening: VALIDATE and its magic.
constexpr std::array<std::uint8_t, 5> kV2Opening = {0x00, 0xCE, 0xF7, 0x85, 0x3C};

// A large request leaves this much capacity behind at most.
constexpr std::size_t kKeptStrings = 16;
constexpr std::size_t kKeptStringBytes = 64 * 1024;
// Strings up to this size are reserved whole when their length arrives.
constexpr std::size_t kReservedAtOnce = 4096;

std::string hex_byte(std::uint8_t b) {
  constexpr char digits[] = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

}  // namespace

std::string_view dialect_name(Dialect dialect) { return dialect == Dialect::V1 ? "1.x" : "2.x"; }

std::string_view command_name(Command command) {
  switch (command) {
    case Validate:
      return "VALIDATE";
    case Set:
      return "SET";
    case CompareSet:
      return "COMPARE_SET";
    case Get:
      return "GET";
    case Add:
      return "ADD";
    case Check:
      return "CHECK";
    case Wait:
      return "WAIT";
    case GetNumKeys:
      return "GETNUMKEYS";
    case WatchKey:
      return "WATCH_KEY";
    case DeleteKey:
      return "DELETE_KEY";
    case Append:
      return "APPEND";
    case MultiGet:
      return "MULTI_GET";
    case MultiSet:
      return "MULTI_SET";
    case CancelWait:
      return "CANCEL_WAIT";
    case Ping:
      return "PING";
    case QueuePush:
      return "QUEUE_PUSH";
    case QueuePop:
      return "QUEUE_POP";
    case QueueLen:
      return "QUEUE_LEN";
  }
  return "?";
}

std::optional<Command> decode_command(Dialect dialect, std::uint8_t byte) {
  if (dialect == Dialect::V1) {
    if (byte < kV1Table.size()) return kV1Table[byte];
  } else if (byte < kV2Table.size()) {
    return kV2Table[byte];
  }
  return std::nullopt;
}

std::optional<std::uint8_t> encode_command(Dialect dialect, Command command) {
  auto find = [command](const auto& table) -> std::optional<std::uint8_t> {
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (table[i] == command) return static_cast<std::uint8_t>(i);
    }
    return std::nullopt;
  };
  return dialect == Dialect::V1 ? find(kV1Table) : find(kV2Table);
}

// ---- encoders -------------------------------------------------------------------------

void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }

void put_u32(std::string& out, std::uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out.append(b, 4);
}

void put_u64(std::string& out, std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out.append(b, 8);
}

void put_i64(std::string& out, std::int64_t v) { put_u64(out, static_cast<std::uint64_t>(v)); }

void put_bytes(std::string& out, std::string_view bytes) {
  put_u64(out, bytes.size());
  out.append(bytes);
}

std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::int64_t get_i64(const char* p) { return static_cast<std::int64_t>(get_u64(p)); }

void encode_request(Dialect dialect, const Request& r, std::string& out) {
  auto byte = encode_command(dialect, r.command);
  if (!byte) {
    throw std::invalid_argument(std::string(command_name(r.command)) + " does not exist in the " +
                                std::string(dialect_name(dialect)) + " dialect");
  }
  put_u8(out, *byte);
  switch (r.command) {
    case Validate:
    case Ping:
      put_u32(out, r.u32);
      break;
    case Set:
    case Append:
    case QueuePush:
      put_bytes(out, r.key());
      put_bytes(out, r.value());
      break;
    case CompareSet:
      put_bytes(out, r.key());
      put_bytes(out, r.value(0));
      put_bytes(out, r.value(1));
      break;
    case Get:
    case DeleteKey:
    case WatchKey:
    case QueuePop:
    case QueueLen:
      put_bytes(out, r.key());
      break;
    case Add:
      put_bytes(out, r.key());
      put_i64(out, r.delta);
      break;
    case Check:
    case Wait:
    case MultiGet:
      put_u64(out, r.key_count);
      for (std::size_t i = 0; i < r.key_count; ++i) put_bytes(out, r.key(i));
      break;
    case MultiSet:
      put_u64(out, r.key_count);
      for (std::size_t i = 0; i < r.key_count; ++i) {
        put_bytes(out, r.key(i));
        put_bytes(out, r.value(i));
      }
      break;
    case GetNumKeys:
    case CancelWait:
      break;
  }
}

Request make_request(Command command, std::vector<std::string> keys,
                     std::vector<std::string> values, std::int64_t delta, std::uint32_t u32) {
  Request r;
  r.command = command;
  r.key_count = keys.size();
  r.value_count = values.size();
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.delta = delta;
  r.u32 = u32;
  return r;
}

// ---- parser ---------------------------------------------------------------------------

RequestParser::RequestParser(Limits limits, std::optional<Dialect> dialect)
    : limits_(limits), dialect_(dialect), sniffing_(!dialect) {}

RequestParser::Result RequestParser::fail(std::string reason, std::size_t consumed) {
  error_ = std::move(reason);
  return {Status::Error, consumed};
}

void RequestParser::trim() {
  if (request_.keys.size() > kKeptStrings) request_.keys.resize(kKeptStrings);
  if (request_.values.size() > kKeptStrings) request_.values.resize(kKeptStrings);
  request_.keys.shrink_to_fit();
  request_.values.shrink_to_fit();
  for (auto* list : {&request_.keys, &request_.values}) {
    for (auto& s : *list) {
      if (s.capacity() > kKeptStringBytes) std::string().swap(s);
    }
  }
}

// Matches the first bytes against the 2.x opening. Returns true once the dialect is known;
// replay_count says how many opening bytes were matched before a mismatch (they are then
// parsed again as 1.x).
bool RequestParser::sniff(std::string_view data, std::size_t& used, std::uint8_t& replay_count) {
  while (used < data.size()) {
    auto byte = static_cast<std::uint8_t>(data[used]);
    if (byte != kV2Opening[sniffed_]) {
      dialect_ = Dialect::V1;
      replay_count = sniffed_;
      return true;
    }
    ++used;
    if (++sniffed_ == kV2Opening.size()) {
      dialect_ = Dialect::V2;
      replay_count = 0;
      return true;
    }
  }
  return false;
}

RequestParser::Result RequestParser::feed(std::string_view data) {
  if (!error_.empty()) return {Status::Error, 0};
  if (step_ == Step::Done) step_ = Step::Command;
  std::size_t pos = 0;
  if (sniffing_) {
    std::uint8_t replay = 0;
    if (!sniff(data, pos, replay)) return {Status::NeedMore, pos};
    sniffing_ = false;
    if (*dialect_ == Dialect::V2) {
      // The opening is a complete VALIDATE with the right magic.
      request_.command = Command::Validate;
      request_.key_count = request_.value_count = 0;
      request_.u32 = kValidationMagic;
      step_ = Step::Done;
      return {Status::Complete, pos};
    }
    if (replay > 0) {
      auto opening = reinterpret_cast<const char*>(kV2Opening.data());
      auto r = feed(std::string_view(opening, replay));
      if (r.status == Status::Error) return {Status::Error, pos};
    }
  }
  while (pos < data.size()) {
    switch (step_) {
      case Step::Command:
      case Step::Done:
        if (!start_command(static_cast<std::uint8_t>(data[pos]))) {
          return {Status::Error, pos};
        }
        ++pos;
        break;
      case Step::Fixed:
      case Step::Length: {
        std::size_t n = std::min(scratch_need_ - scratch_have_, data.size() - pos);
        std::memcpy(scratch_ + scratch_have_, data.data() + pos, n);
        scratch_have_ += n;
        pos += n;
        request_bytes_ += n;
        if (scratch_have_ < scratch_need_) break;
        bool ok = step_ == Step::Fixed ? finish_fixed() : finish_length();
        if (!ok) return {Status::Error, pos};
        break;
      }
      case Step::Body: {
        std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(body_left_, data.size() - pos));
        body_target().append(data.data() + pos, n);
        pos += n;
        body_left_ -= n;
        if (body_left_ == 0) {
          ++fields_done_;
          if (!begin_field()) return {Status::Error, pos};
        }
        break;
      }
    }
    if (step_ == Step::Done) return {Status::Complete, pos};
  }
  return {Status::NeedMore, pos};
}

bool RequestParser::start_command(std::uint8_t byte) {
  if (request_bytes_ > kKeptStringBytes) trim();
  auto command = decode_command(*dialect_, byte);
  if (!command) {
    error_ = "unknown command byte " + hex_byte(byte) + " in the " +
             std::string(dialect_name(*dialect_)) + " dialect";
    return false;
  }
  request_.command = *command;
  request_.key_count = request_.value_count = 0;
  request_.delta = 0;
  request_.u32 = 0;
  count_ = 0;
  fields_done_ = 0;
  request_bytes_ = 1;
  return begin_field();
}

RequestParser::Field RequestParser::next_field() const {
  const std::size_t i = fields_done_;
  switch (request_.command) {
    case Validate:
    case Ping:
      return i == 0 ? Field::U32 : Field::None;
    case Set:
    case Append:
    case QueuePush:
      return i == 0 ? Field::Key : i == 1 ? Field::Value : Field::None;
    case CompareSet:
      return i == 0 ? Field::Key : i <= 2 ? Field::Value : Field::None;
    case Get:
    case DeleteKey:
    case WatchKey:
    case QueuePop:
    case QueueLen:
      return i == 0 ? Field::Key : Field::None;
    case Add:
      return i == 0 ? Field::Key : i == 1 ? Field::I64 : Field::None;
    case Check:
    case Wait:
    case MultiGet:
      if (i == 0) return Field::Count;
      return i - 1 < count_ ? Field::Key : Field::None;
    case MultiSet:
      if (i == 0) return Field::Count;
      if (i - 1 >= 2 * count_) return Field::None;
      return (i - 1) % 2 == 0 ? Field::Key : Field::Value;
    case GetNumKeys:
    case CancelWait:
      return Field::None;
  }
  return Field::None;
}

bool RequestParser::begin_field() {
  field_ = next_field();
  scratch_have_ = 0;
  switch (field_) {
    case Field::None:
      step_ = Step::Done;
      return true;
    case Field::U32:
      scratch_need_ = 4;
      step_ = Step::Fixed;
      return true;
    case Field::I64:
    case Field::Count:
      scratch_need_ = 8;
      step_ = Step::Fixed;
      return true;
    case Field::Key:
    case Field::Value:
      scratch_need_ = 8;
      step_ = Step::Length;
      return true;
  }
  return true;
}

bool RequestParser::finish_fixed() {
  if (field_ == Field::U32) {
    request_.u32 = get_u32(reinterpret_cast<const char*>(scratch_));
  } else if (field_ == Field::I64) {
    request_.delta = get_i64(reinterpret_cast<const char*>(scratch_));
  } else {
    std::uint64_t count = get_u64(reinterpret_cast<const char*>(scratch_));
    if (count > limits_.max_keys_per_request) {
      error_ = std::string(command_name(request_.command)) + " of " + std::to_string(count) +
               " keys exceeds the limit of " + std::to_string(limits_.max_keys_per_request);
      return false;
    }
    count_ = count;
  }
  ++fields_done_;
  return begin_field();
}

bool RequestParser::finish_length() {
  const std::uint64_t len = get_u64(reinterpret_cast<const char*>(scratch_));
  const bool is_key = field_ == Field::Key;
  const std::size_t limit = is_key ? limits_.max_key_bytes : limits_.max_value_bytes;
  if (len > limit) {
    error_ = std::string(command_name(request_.command)) + (is_key ? " key" : " value") + " of " +
             std::to_string(len) + " bytes exceeds the limit of " + std::to_string(limit) +
             " bytes";
    return false;
  }
  // Written so that no sum can wrap, whatever the limits.
  if (request_bytes_ > limits_.max_request_bytes ||
      len > limits_.max_request_bytes - request_bytes_) {
    error_ = std::string(command_name(request_.command)) + " request of " +
             std::to_string(request_bytes_) + " bytes and a field of " + std::to_string(len) +
             " bytes exceeds the limit of " + std::to_string(limits_.max_request_bytes) + " bytes";
    return false;
  }
  auto& list = is_key ? request_.keys : request_.values;
  auto& used = is_key ? request_.key_count : request_.value_count;
  if (used == list.size()) list.emplace_back();
  std::string& target = list[used++];
  target.clear();
  // Small strings at once; large ones grow only as their bytes arrive.
  if (len <= kReservedAtOnce) target.reserve(static_cast<std::size_t>(len));
  body_left_ = len;
  request_bytes_ += len;
  if (len == 0) {
    ++fields_done_;
    return begin_field();
  }
  step_ = Step::Body;
  return true;
}

std::string& RequestParser::body_target() {
  return field_ == Field::Key ? request_.keys[request_.key_count - 1]
                              : request_.values[request_.value_count - 1];
}

// ---- reply parser -------------------------------------------------------------------

bool has_reply(Command command) {
  switch (command) {
    case Validate:
    case Set:
    case Append:
    case MultiSet:
    case QueuePush:
      return false;
    default:
      return true;
  }
}

void ReplyParser::expect(Command command, std::size_t key_count) {
  command_ = command;
  key_count_ = key_count;
  reply_.number = 0;
  reply_.code = 0;
  reply_.u32 = 0;
  reply_.values.clear();
  fields_done_ = 0;
  reply_bytes_ = 0;
  error_.clear();
  begin_field();
}

ReplyParser::Field ReplyParser::next_field() const {
  const std::size_t i = fields_done_;
  switch (command_) {
    case Ping:
      return i == 0 ? Field::U32 : Field::None;
    case Get:
    case CompareSet:
      return i == 0 ? Field::Length : Field::None;
    case Add:
    case GetNumKeys:
    case DeleteKey:
    case QueueLen:
      return i == 0 ? Field::I64 : Field::None;
    case Check:
    case Wait:
    case CancelWait:
    case WatchKey:
      return i == 0 ? Field::U8 : Field::None;
    case MultiGet:
      return i < key_count_ ? Field::Length : Field::None;
    case QueuePop:
      if (i == 0) return Field::I64;
      return i == 1 && reply_.number > 0 ? Field::Length : Field::None;
    default:
      return Field::None;
  }
}

void ReplyParser::begin_field() {
  field_ = next_field();
  in_body_ = false;
  scratch_have_ = 0;
  scratch_need_ = field_ == Field::U8 ? 1 : field_ == Field::U32 ? 4 : 8;
}

bool ReplyParser::finish_fixed() {
  const char* p = reinterpret_cast<const char*>(scratch_);
  switch (field_) {
    case Field::U8:
      reply_.code = scratch_[0];
      break;
    case Field::U32:
      reply_.u32 = get_u32(p);
      break;
    case Field::I64:
      reply_.number = get_i64(p);
      break;
    case Field::Length: {
      const std::uint64_t len = get_u64(p);
      if (len > limits_.max_value_bytes) {
        error_ = "the server sent a value of " + std::to_string(len) +
                 " bytes, over the limit of " + std::to_string(limits_.max_value_bytes);
        return false;
      }
      if (reply_bytes_ > limits_.max_reply_bytes || len > limits_.max_reply_bytes - reply_bytes_) {
        error_ = "the server sent a reply of more than " + std::to_string(limits_.max_reply_bytes) +
                 " bytes, over the limit";
        return false;
      }
      reply_bytes_ += len;
      reply_.values.emplace_back().reserve(
          static_cast<std::size_t>(std::min<std::uint64_t>(len, kReservedAtOnce)));
      body_left_ = len;
      in_body_ = true;
      return true;
    }
    case Field::None:
      break;
  }
  ++fields_done_;
  begin_field();
  return true;
}

ReplyParser::Result ReplyParser::feed(std::string_view data) {
  if (!error_.empty()) return {Status::Error, 0};
  std::size_t pos = 0;
  while (field_ != Field::None) {
    if (in_body_) {
      auto n = static_cast<std::size_t>(std::min<std::uint64_t>(body_left_, data.size() - pos));
      reply_.values.back().append(data.data() + pos, n);
      pos += n;
      body_left_ -= n;
      if (body_left_ > 0) return {Status::NeedMore, pos};
      ++fields_done_;
      begin_field();
      continue;
    }
    if (pos == data.size()) return {Status::NeedMore, pos};
    std::size_t n = std::min(scratch_need_ - scratch_have_, data.size() - pos);
    std::memcpy(scratch_ + scratch_have_, data.data() + pos, n);
    scratch_have_ += n;
    pos += n;
    reply_bytes_ += n;
    if (scratch_have_ < scratch_need_) return {Status::NeedMore, pos};
    if (!finish_fixed()) return {Status::Error, pos};
  }
  return {Status::Complete, pos};
}

}  // namespace ddp::store
