#include "ddp/store/wire_codec.hpp"

#include <catch2/catch.hpp>
#include <random>

using namespace ddp::store;

namespace {

std::string hex_bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

std::string u64le(std::uint64_t v) {
  std::string out;
  put_u64(out, v);
  return out;
}

// Feeds one byte at a time; returns every completed request's re-encoding and the status of
// the last feed.
struct Fed {
  std::vector<Request> requests;
  RequestParser::Status last = RequestParser::Status::NeedMore;
  std::string error;
  std::optional<Dialect> dialect;
};

Fed feed_bytewise(std::string_view bytes, std::optional<Dialect> dialect = std::nullopt,
                  Limits limits = {}) {
  RequestParser parser(limits, dialect);
  Fed fed;
  for (char c : bytes) {
    auto r = parser.feed(std::string_view(&c, 1));
    fed.last = r.status;
    if (r.status == RequestParser::Status::Error) {
      fed.error = parser.error();
      break;
    }
    CHECK(r.consumed == 1);
    if (r.status == RequestParser::Status::Complete) fed.requests.push_back(parser.request());
  }
  fed.dialect = parser.dialect();
  return fed;
}

// Feeds everything in chunks of `chunk` bytes.
std::vector<Request> feed_chunks(std::string_view bytes, std::size_t chunk, Dialect dialect) {
  RequestParser parser({}, dialect);
  std::vector<Request> out;
  while (!bytes.empty()) {
    auto piece = bytes.substr(0, chunk);
    while (!piece.empty()) {
      auto r = parser.feed(piece);
      REQUIRE(r.status != RequestParser::Status::Error);
      piece.remove_prefix(r.consumed);
      bytes.remove_prefix(r.consumed);
      if (r.status == RequestParser::Status::Complete) out.push_back(parser.request());
      if (r.status == RequestParser::Status::NeedMore) break;
    }
  }
  return out;
}

std::vector<Request> every_command(Dialect dialect) {
  std::vector<Request> all = {
      make_request(Command::Set, {"/k1"}, {"v1"}),
      make_request(Command::CompareSet, {"key"}, {"", "desired"}),
      make_request(Command::Get, {"key"}),
      make_request(Command::Add, {"init/"}, {}, -7),
      make_request(Command::Check, {"a", "bb", ""}),
      make_request(Command::Wait, {"x"}),
      make_request(Command::GetNumKeys),
      make_request(Command::DeleteKey, {"gone"}),
  };
  if (dialect == Dialect::V1) {
    all.push_back(make_request(Command::WatchKey, {"watched"}));
  } else {
    for (auto r :
         {make_request(Command::Validate, {}, {}, 0, kValidationMagic),
          make_request(Command::Append, {"log"}, {std::string("\0\1", 2)}),
          make_request(Command::MultiGet, {"a", "b"}),
          make_request(Command::MultiSet, {"a", "b"}, {"1", ""}), make_request(Command::CancelWait),
          make_request(Command::Ping, {}, {}, 0, 77),
          make_request(Command::QueuePush, {"q"}, {"item"}), make_request(Command::QueuePop, {"q"}),
          make_request(Command::QueueLen, {"q"})}) {
      all.push_back(r);
    }
  }
  return all;
}

void check_same(const Request& a, const Request& b) {
  CHECK(a.command == b.command);
  REQUIRE(a.key_count == b.key_count);
  REQUIRE(a.value_count == b.value_count);
  for (std::size_t i = 0; i < a.key_count; ++i) CHECK(a.key(i) == b.key(i));
  for (std::size_t i = 0; i < a.value_count; ++i) CHECK(a.value(i) == b.value(i));
  CHECK(a.delta == b.delta);
  CHECK(a.u32 == b.u32);
}

}  // namespace

TEST_CASE("command tables match both dialects' byte values") {
  CHECK(encode_command(Dialect::V1, Command::Set) == 0);
  CHECK(encode_command(Dialect::V1, Command::WatchKey) == 7);
  CHECK(encode_command(Dialect::V1, Command::DeleteKey) == 8);
  CHECK_FALSE(encode_command(Dialect::V1, Command::Ping));
  CHECK(encode_command(Dialect::V2, Command::Validate) == 0);
  CHECK(encode_command(Dialect::V2, Command::Set) == 1);
  CHECK(encode_command(Dialect::V2, Command::DeleteKey) == 8);
  CHECK(encode_command(Dialect::V2, Command::Ping) == 13);
  CHECK(encode_command(Dialect::V2, Command::QueueLen) == 16);
  CHECK_FALSE(encode_command(Dialect::V2, Command::WatchKey));
  CHECK_FALSE(decode_command(Dialect::V1, 9));
  CHECK_FALSE(decode_command(Dialect::V2, 17));
}

TEST_CASE("a 1.13 SET request, byte-exact, fed byte by byte") {
  const std::string wire = hex_bytes(
      {0x00, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6b, 0x31, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31});
  std::string encoded;
  encode_request(Dialect::V1, make_request(Command::Set, {"/k1"}, {"v1"}), encoded);
  CHECK(encoded == wire);

  Fed fed = feed_bytewise(wire);
  REQUIRE(fed.requests.size() == 1);
  CHECK(fed.dialect == Dialect::V1);
  CHECK(fed.requests[0].command == Command::Set);
  CHECK(fed.requests[0].key() == "/k1");
  CHECK(fed.requests[0].value() == "v1");
}

TEST_CASE("2.x opening VALIDATE is 00 CE F7 85 3C and selects the 2.x dialect") {
  const std::string wire = hex_bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C});
  std::string encoded;
  encode_request(Dialect::V2, make_request(Command::Validate, {}, {}, 0, kValidationMagic),
                 encoded);
  CHECK(encoded == wire);
  // Then a PING with nonce 5: 0d 05 00 00 00.
  Fed fed = feed_bytewise(wire + hex_bytes({0x0d, 0x05, 0, 0, 0}));
  CHECK(fed.dialect == Dialect::V2);
  REQUIRE(fed.requests.size() == 2);
  CHECK(fed.requests[0].command == Command::Validate);
  CHECK(fed.requests[0].u32 == kValidationMagic);
  CHECK(fed.requests[1].command == Command::Ping);
  CHECK(fed.requests[1].u32 == 5);
}

TEST_CASE("a 1.x request that starts like the 2.x opening is parsed as 1.x") {
  // SET whose key length's low byte is 0xCE: 206-byte key.
  std::string wire = hex_bytes({0x00, 0xCE, 0, 0, 0, 0, 0, 0, 0});
  wire += std::string(206, 'k');
  wire += u64le(1) + "v";
  Fed fed = feed_bytewise(wire);
  CHECK(fed.dialect == Dialect::V1);
  REQUIRE(fed.requests.size() == 1);
  CHECK(fed.requests[0].key() == std::string(206, 'k'));
  // A first byte other than 0 is 1.x at once (GETNUMKEYS).
  Fed num = feed_bytewise(hex_bytes({0x06}));
  CHECK(num.dialect == Dialect::V1);
  REQUIRE(num.requests.size() == 1);
  CHECK(num.requests[0].command == Command::GetNumKeys);
}

TEST_CASE("every command round-trips in both dialects, byte by byte and in chunks") {
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    std::string wire;
    auto all = every_command(dialect);
    for (const auto& r : all) encode_request(dialect, r, wire);
    Fed fed = feed_bytewise(wire, dialect);
    REQUIRE(fed.requests.size() == all.size());
    for (std::size_t i = 0; i < all.size(); ++i) check_same(fed.requests[i], all[i]);
    for (std::size_t chunk : {2u, 3u, 7u, 64u, 4096u}) {
      auto chunked = feed_chunks(wire, chunk, dialect);
      REQUIRE(chunked.size() == all.size());
      for (std::size_t i = 0; i < all.size(); ++i) check_same(chunked[i], all[i]);
    }
  }
}

TEST_CASE("encoded fields are little-endian with u64 lengths") {
  std::string add;
  encode_request(Dialect::V2, make_request(Command::Add, {"c"}, {}, 1), add);
  CHECK(add == hex_bytes({0x04, 1, 0, 0, 0, 0, 0, 0, 0, 'c', 1, 0, 0, 0, 0, 0, 0, 0}));
  std::string wait;
  encode_request(Dialect::V1, make_request(Command::Wait, {"a", "b"}), wait);
  CHECK(wait == hex_bytes({0x05, 2, 0, 0,   0, 0, 0, 0, 0, 1, 0, 0, 0,  0,
                           0,    0, 0, 'a', 1, 0, 0, 0, 0, 0, 0, 0, 'b'}));
  std::string cas;
  encode_request(Dialect::V2, make_request(Command::CompareSet, {"k"}, {"", "d"}), cas);
  CHECK(cas == hex_bytes({0x02, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 0, 0, 0,  0,
                          0,    0, 0, 0, 1, 0, 0, 0, 0, 0,   0, 0, 'd'}));
  CHECK_THROWS_AS(encode_request(Dialect::V1, make_request(Command::Ping), cas),
                  std::invalid_argument);
}

TEST_CASE("lengths over the limits fail before anything is allocated") {
  SECTION("a key of 2^63 bytes") {
    Fed fed = feed_bytewise(hex_bytes({0x02}) + u64le(1ULL << 63), Dialect::V1);
    CHECK(fed.last == RequestParser::Status::Error);
    CHECK_THAT(fed.error, Catch::Contains("exceeds the limit of 8192"));
  }
  SECTION("a value of 2^63 bytes") {
    Fed fed = feed_bytewise(hex_bytes({0x01}) + u64le(1) + "k" + u64le(1ULL << 63), Dialect::V2);
    CHECK(fed.last == RequestParser::Status::Error);
    CHECK_THAT(fed.error, Catch::Contains("value of 9223372036854775808 bytes"));
  }
  SECTION("2^63 keys") {
    Fed fed = feed_bytewise(hex_bytes({0x06}) + u64le(1ULL << 63), Dialect::V2);
    CHECK(fed.last == RequestParser::Status::Error);
    CHECK_THAT(fed.error, Catch::Contains("WAIT of 9223372036854775808 keys"));
  }
  SECTION("configured limits") {
    Limits small;
    small.max_key_bytes = 4;
    small.max_value_bytes = 4;
    small.max_keys_per_request = 2;
    small.max_request_bytes = 40;
    CHECK(feed_bytewise(hex_bytes({0x03}) + u64le(5) + "abcde", Dialect::V1, small).last ==
          RequestParser::Status::Error);
    CHECK(feed_bytewise(hex_bytes({0x04}) + u64le(3), Dialect::V1, small).last ==
          RequestParser::Status::Error);
    Fed ok = feed_bytewise(hex_bytes({0x02}) + u64le(4) + "abcd", Dialect::V1, small);
    CHECK(ok.requests.size() == 1);
    // Two pairs of 4+4 bytes: 1 + 8 + 2 * (8 + 4 + 8 + 4) = 57 > 40.
    std::string multi;
    encode_request(Dialect::V2, make_request(Command::MultiSet, {"aaaa", "bbbb"}, {"1111", "2222"}),
                   multi);
    Fed big = feed_bytewise(multi, Dialect::V2, small);
    CHECK(big.last == RequestParser::Status::Error);
    CHECK_THAT(big.error, Catch::Contains("exceeds the limit of 40 bytes"));
  }
  SECTION("a request total that would overflow 64 bits with an unlimited value size") {
    Limits unlimited_values;
    unlimited_values.max_value_bytes = ~std::size_t{0};
    unlimited_values.max_request_bytes = 1024;
    Fed fed = feed_bytewise(hex_bytes({0x01}) + u64le(1) + "k" + u64le(~0ULL), Dialect::V2,
                            unlimited_values);
    CHECK(fed.last == RequestParser::Status::Error);
    CHECK_THAT(fed.error, Catch::Contains("exceeds the limit of 1024 bytes"));
  }
}

TEST_CASE("unknown commands fail and the parser stays failed") {
  RequestParser v1({}, Dialect::V1);
  CHECK(v1.feed(hex_bytes({0x09})).status == RequestParser::Status::Error);
  CHECK_THAT(v1.error(), Catch::Contains("unknown command byte 0x09 in the 1.x dialect"));
  CHECK(v1.feed(hex_bytes({0x06})).status == RequestParser::Status::Error);
  RequestParser v2({}, Dialect::V2);
  CHECK(v2.feed(hex_bytes({0xff})).status == RequestParser::Status::Error);
}

TEST_CASE("random garbage never crashes the parser and never holds much memory") {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 2000; ++round) {
    std::string bytes(rng() % 200, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    if (round % 3 == 0 && !bytes.empty()) bytes[0] = static_cast<char>(rng() % 17);
    RequestParser parser;
    std::string_view rest = bytes;
    while (!rest.empty()) {
      auto r = parser.feed(rest.substr(0, 1 + rng() % 16));
      rest.remove_prefix(r.consumed);
      if (r.status == RequestParser::Status::Error) break;
      if (r.consumed == 0 && r.status != RequestParser::Status::Complete) break;
    }
    std::size_t held = 0;
    for (std::size_t i = 0; i < parser.request().keys.size(); ++i)
      held += parser.request().keys[i].capacity();
    for (std::size_t i = 0; i < parser.request().values.size(); ++i)
      held += parser.request().values[i].capacity();
    const std::size_t strings = parser.request().keys.size() + parser.request().values.size();
    CHECK(held <= 2 * bytes.size() + strings * (4096 + 32));
  }
}

namespace {

struct Parsed {
  ReplyParser::Status status;
  std::size_t consumed = 0;
  Reply reply;
  std::string error;
};

// Feeds wire to a parser expecting command's reply, one byte at a time.
Parsed parse_reply(Command command, const std::string& wire, std::size_t key_count = 0,
                   Limits limits = {}) {
  ReplyParser parser(limits);
  parser.expect(command, key_count);
  Parsed out{ReplyParser::Status::NeedMore, 0, {}, {}};
  for (std::size_t i = 0; i <= wire.size(); ++i) {
    auto result = parser.feed(std::string_view(wire).substr(i, i < wire.size() ? 1 : 0));
    out.consumed += result.consumed;
    out.status = result.status;
    if (result.status != ReplyParser::Status::NeedMore) break;
  }
  out.reply = parser.reply();
  out.error = parser.error();
  return out;
}

std::string value_bytes(std::string_view v) {
  std::string out;
  put_bytes(out, v);
  return out;
}

}  // namespace

TEST_CASE("reply parser: every reply shape, fed byte by byte") {
  using Status = ReplyParser::Status;
  auto get = parse_reply(Command::Get, value_bytes("v1"));
  CHECK(get.status == Status::Complete);
  CHECK(get.reply.values == std::vector<std::string>{"v1"});
  auto multi =
      parse_reply(Command::MultiGet, value_bytes("a") + value_bytes("") + value_bytes("ccc"), 3);
  CHECK(multi.status == Status::Complete);
  CHECK(multi.reply.values == std::vector<std::string>{"a", "", "ccc"});
  std::string i64;
  put_i64(i64, -42);
  auto add = parse_reply(Command::Add, i64);
  CHECK(add.status == Status::Complete);
  CHECK(add.reply.number == -42);
  std::string u32;
  put_u32(u32, 0xDEADBEEF);
  CHECK(parse_reply(Command::Ping, u32).reply.u32 == 0xDEADBEEF);
  CHECK(parse_reply(Command::Check, std::string(1, '\1')).reply.code == kCheckNotReady);
  std::string empty_pop;
  put_i64(empty_pop, 0);
  auto none = parse_reply(Command::QueuePop, empty_pop);
  CHECK(none.status == Status::Complete);
  CHECK(none.reply.values.empty());
  std::string pop;
  put_i64(pop, 2);
  auto popped = parse_reply(Command::QueuePop, pop + value_bytes("first"));
  CHECK(popped.reply.number == 2);
  CHECK(popped.reply.values == std::vector<std::string>{"first"});
}

TEST_CASE(
    "reply parser: it stops at the end of the reply, and commands without one are complete at "
    "once") {
  ReplyParser parser;
  parser.expect(Command::Wait);
  auto result = parser.feed(std::string("\0\0\0", 3));
  CHECK(result.status == ReplyParser::Status::Complete);
  CHECK(result.consumed == 1);
  parser.expect(Command::Set);
  result = parser.feed("x");
  CHECK(result.status == ReplyParser::Status::Complete);
  CHECK(result.consumed == 0);
  CHECK_FALSE(has_reply(Command::Set));
  CHECK(has_reply(Command::Get));
}

TEST_CASE("reply parser: a value over the limit fails before anything is allocated") {
  Limits limits;
  limits.max_value_bytes = 16;
  std::string huge;
  put_u64(huge, std::uint64_t{1} << 62);
  auto parsed = parse_reply(Command::Get, huge, 0, limits);
  CHECK(parsed.status == ReplyParser::Status::Error);
  CHECK_THAT(parsed.error, Catch::Contains("over the limit of 16"));
  limits.max_value_bytes = 1024;
  limits.max_reply_bytes = 100;
  auto multi =
      parse_reply(Command::MultiGet,
                  value_bytes(std::string(60, 'a')) + value_bytes(std::string(60, 'b')), 2, limits);
  CHECK(multi.status == ReplyParser::Status::Error);
}

TEST_CASE("reply parser: random bytes as any reply never crash it nor make it hold much") {
  constexpr Command kAnswered[] = {Command::Ping,       Command::Get,        Command::CompareSet,
                                   Command::Add,        Command::GetNumKeys, Command::DeleteKey,
                                   Command::QueueLen,   Command::Check,      Command::Wait,
                                   Command::CancelWait, Command::MultiGet,   Command::QueuePop};
  std::mt19937_64 rng(54321);
  Limits limits;
  limits.max_value_bytes = 1024;
  limits.max_reply_bytes = 4096;
  ReplyParser parser(limits);
  for (int round = 0; round < 5000; ++round) {
    std::string bytes(rng() % 300, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() % 8 : rng());
    parser.expect(kAnswered[rng() % std::size(kAnswered)], rng() % 8);
    std::string_view rest = bytes;
    auto status = ReplyParser::Status::NeedMore;
    while (!rest.empty() && status == ReplyParser::Status::NeedMore) {
      auto r = parser.feed(rest.substr(0, 1 + rng() % 16));
      rest.remove_prefix(r.consumed);
      status = r.status;
    }
    std::size_t held = 0;
    for (const auto& value : parser.reply().values) held += value.size();
    CHECK(held <= limits.max_reply_bytes);
  }
}
