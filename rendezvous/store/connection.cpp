#include "connection.hpp"

#include <boost/asio/post.hpp>
#include <ctime>
#include <utility>

#include "ddp/store/store_util.hpp"

namespace ddp::store {
namespace {

// Close a client that lets this much pushed output (watch events) pile up unread.
constexpr std::size_t kMaxPushedOutput = 2 * kMaxQueuedOutput;

std::string quoted(std::string_view key) {  // for log lines: long keys cut short
  constexpr std::size_t kShown = 64;
  std::string out = "'";
  out.append(key.substr(0, kShown));
  if (key.size() > kShown) out += "...";
  return out + "'";
}

std::string hex32(std::uint32_t v) {
  constexpr char digits[] = "0123456789abcdef";
  std::string out = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) out += digits[(v >> shift) & 15];
  return out;
}

}  // namespace

Connection::Connection(std::shared_ptr<Server::Impl> server, std::string peer)
    : server_(std::move(server)), peer_(std::move(peer)), parser_(server_->options.limits) {}

void Connection::close(std::string_view reason) {
  if (closed_) return;
  auto self = shared_from_this();  // remove() below drops the server's reference
  closed_ = true;
  if (!reason.empty()) {
    server_->log("closed connection from " + peer_ + ": " + std::string(reason));
    ++server_->rejected;
  }
  cancel_waits();
  server_->queued_reply_bytes -= static_cast<std::int64_t>(accounted_);
  accounted_ = 0;
  for (const auto& key : watched_) server_->table.unwatch(key, *this);
  watched_.clear();
  close_socket();
  server_->remove(this);
}

void Connection::cancel_waits() {
  for (auto& [raw, waiter] : waiters_) server_->table.cancel_wait(*waiter);
  server_->pending_waits -= static_cast<std::int64_t>(waiters_.size());
  waiters_.clear();
}

bool Connection::process(const char* data, std::size_t size) {
  std::string_view rest(data, size);
  while (!rest.empty()) {
    if (backlog() > kMaxQueuedOutput) {  // answer the rest once the client read some
      unread_.assign(rest);
      break;
    }
    auto result = parser_.feed(rest);
    rest.remove_prefix(result.consumed);
    if (result.status == RequestParser::Status::Error) {
      close(parser_.error());
      return false;
    }
    if (result.status == RequestParser::Status::NeedMore) break;
    ++server_->requests;
    if (!handle(parser_.request())) return false;
    if (!within_output_budget()) return false;
  }
  server_->keys.store(static_cast<std::int64_t>(server_->table.size()), std::memory_order_relaxed);
  server_->stored_bytes.store(static_cast<std::int64_t>(server_->table.stored_bytes()),
                              std::memory_order_relaxed);
  return true;
}

void Connection::reset_if_asked(std::string_view key) {
  const ServerOptions& options = server_->options;
  if (!options.reset_after_set) return;
  const std::string* value = server_->table.find(key);
  if (!value || !options.reset_after_set(key, *value)) return;
  // The key itself may go too (the table's own string): nothing reads it after this.
  server_->table.erase_all_but(options.keep_on_reset);
}

bool Connection::handle(Request& r) {
  auto& table = server_->table;
  if (!fits_store_budget(r)) return false;
  switch (r.command) {
    case Command::Validate:
      if (r.u32 != kValidationMagic) {
        close("VALIDATE with wrong magic " + hex32(r.u32));
        return false;
      }
      return true;
    case Command::Ping:
      put_u32(out_, r.u32);
      return true;
    case Command::Set:
      table.set(r.key(), std::move(r.values[0]));
      reset_if_asked(r.key());
      return true;
    case Command::CompareSet:
      put_bytes(out_, table.compare_set(r.key(), std::move(r.values[0]), std::move(r.values[1])));
      reset_if_asked(r.key());
      return true;
    case Command::Get: {
      // Like PyTorch's server: a missing key reads as empty (clients WAIT first).
      const std::string* value = table.find(r.key());
      put_bytes(out_, value ? std::string_view(*value) : std::string_view());
      return true;
    }
    case Command::Add: {
      if (!server_->options.clock_key.empty() && r.key() == server_->options.clock_key) {
        timespec now{};  // the host's clock, not a counter: nothing is stored
        ::clock_gettime(CLOCK_MONOTONIC, &now);
        put_i64(out_, static_cast<std::int64_t>(now.tv_sec) * 1000000000LL + now.tv_nsec);
        return true;
      }
      auto value = table.add(r.key(), r.delta);
      if (!value) {
        close("ADD to key " + quoted(r.key()) + " whose value is not a decimal integer");
        return false;
      }
      put_i64(out_, *value);
      return true;
    }
    case Command::Check: {
      bool all = true;
      for (std::size_t i = 0; i < r.key_count && all; ++i) all = table.present(r.key(i));
      put_u8(out_, all ? kCheckReady : kCheckNotReady);
      return true;
    }
    case Command::Wait:
      return handle_wait(r);
    case Command::GetNumKeys:
      put_i64(out_, static_cast<std::int64_t>(table.size()));
      return true;
    case Command::WatchKey:
      table.watch(r.key(), *this);
      watched_.emplace_back(r.key());
      put_u8(out_, kWatchCallbackRegistered);
      return true;
    case Command::DeleteKey:
      put_i64(out_, table.erase(r.key()) ? 1 : 0);
      return true;
    case Command::Append: {
      // Like SET, no value may outgrow the value limit (clients refuse larger replies).
      const std::string* current = table.find(r.key());
      const std::size_t size = (current ? current->size() : 0) + r.value().size();
      const std::size_t limit = server_->options.limits.max_value_bytes;
      if (size > limit) {
        close("APPEND to key " + quoted(r.key()) + " would make a value of " +
              std::to_string(size) + " bytes, over the limit of " + std::to_string(limit) +
              " bytes");
        return false;
      }
      table.append(r.key(), r.value());
      return true;
    }
    case Command::MultiGet:
      return handle_multi_get(r);
    case Command::MultiSet:
      for (std::size_t i = 0; i < r.key_count; ++i) table.set(r.key(i), std::move(r.values[i]));
      return true;
    case Command::CancelWait:
      cancel_waits();
      put_u8(out_, kWaitCanceled);
      return true;
    case Command::QueuePush:
      table.queue_push(r.key(), std::move(r.values[0]));
      return true;
    case Command::QueuePop: {
      std::string value;
      std::int64_t length = table.queue_pop(r.key(), value);
      put_i64(out_, length);
      if (length > 0) put_bytes(out_, value);
      return true;
    }
    case Command::QueueLen:
      put_i64(out_, table.queue_len(r.key()));
      return true;
  }
  return true;
}

std::size_t Connection::store_growth(const Request& r) const {
  // ADD stores at most this many characters ("-9223372036854775808").
  constexpr std::size_t kCounterDigits = 20;
  const auto& table = server_->table;
  switch (r.command) {
    case Command::Set:
      return table.set_growth(r.key(), r.value().size());
    case Command::CompareSet:
      return table.set_growth(r.key(), r.value(1).size());
    case Command::Add:
      return table.set_growth(r.key(), kCounterDigits);
    case Command::Append:
      return table.append_growth(r.key(), r.value().size());
    case Command::QueuePush:
      return table.push_growth(r.key(), r.value().size());
    case Command::MultiSet: {
      std::size_t growth = 0;
      for (std::size_t i = 0; i < r.key_count; ++i) {
        growth += table.set_growth(r.key(i), r.value(i).size());
      }
      return growth;
    }
    default:
      return 0;
  }
}

bool Connection::fits_store_budget(const Request& r) {
  const std::size_t growth = store_growth(r);
  if (growth == 0) return true;
  const std::size_t stored = server_->table.stored_bytes();
  const std::size_t budget = server_->options.max_stored_bytes;
  if (stored <= budget && growth <= budget - stored) return true;
  close(std::string(command_name(r.command)) + " of key " + quoted(r.key()) +
        " would make the store hold " + std::to_string(stored + growth) +
        " bytes, over its budget of " + std::to_string(budget) +
        " bytes (--max-stored-bytes); nothing of it was stored");
  return false;
}

void Connection::account_output() {
  if (closed_) return;
  server_->queued_reply_bytes +=
      static_cast<std::int64_t>(backlog()) - static_cast<std::int64_t>(accounted_);
  accounted_ = backlog();
}

bool Connection::within_output_budget() {
  account_output();
  const auto total = static_cast<std::size_t>(server_->queued_reply_bytes.load());
  const std::size_t budget = server_->options.max_queued_reply_bytes;
  if (total <= budget || accounted_ == 0) return true;
  close("replies queued for all clients reached " + std::to_string(total) +
        " bytes, over the budget of " + std::to_string(budget) +
        " bytes (--max-queued-reply-bytes); this client had " + std::to_string(accounted_) +
        " bytes of replies it did not read");
  return false;
}

bool Connection::handle_wait(const Request& r) {
  bool all = true;
  for (std::size_t i = 0; i < r.key_count && all; ++i) all = server_->table.present(r.key(i));
  if (all) {  // the common case: answer without registering anything
    put_u8(out_, kStopWaiting);
    return true;
  }
  const std::size_t cap = server_->options.max_waits_per_connection;
  if (waiters_.size() >= cap) {
    close("more than " + std::to_string(cap) +
          " WAITs pending on one connection (--max-waits-per-connection)");
    return false;
  }
  auto waiter = std::make_unique<Waiter>();
  waiter->owner = this;
  if (!server_->table.begin_wait(*waiter, r.keys, r.key_count)) {
    put_u8(out_, kStopWaiting);
    return true;
  }
  const Waiter* raw = waiter.get();
  waiters_.emplace(raw, std::move(waiter));
  ++server_->pending_waits;
  return true;
}

bool Connection::handle_multi_get(const Request& r) {
  std::size_t reply_bytes = 0;
  for (std::size_t i = 0; i < r.key_count; ++i) {
    const std::string* value = server_->table.find(r.key(i));
    reply_bytes += 8 + (value ? value->size() : 0);
  }
  const std::size_t limit = server_->options.limits.max_reply_bytes;
  if (reply_bytes > limit) {
    close("MULTI_GET of " + std::to_string(r.key_count) + " keys needs a reply of " +
          std::to_string(reply_bytes) + " bytes, over the limit of " + std::to_string(limit) +
          " bytes");
    return false;
  }
  for (std::size_t i = 0; i < r.key_count; ++i) {
    const std::string* value = server_->table.find(r.key(i));
    put_bytes(out_, value ? std::string_view(*value) : std::string_view());
  }
  return true;
}

void Connection::on_wait_done(Waiter& waiter) {
  waiters_.erase(&waiter);
  --server_->pending_waits;
  put_u8(out_, kStopWaiting);
  flush();
}

void Connection::on_key_event(std::uint8_t event, std::string_view key, std::string_view old_value,
                              std::string_view new_value) {
  if (closing_) return;
  const bool over_budget = static_cast<std::size_t>(server_->queued_reply_bytes.load()) >
                           server_->options.max_queued_reply_bytes;
  if (backlog() > kMaxPushedOutput || (over_budget && backlog() > 0)) {
    // Not from inside the table's notification loop: close on the next turn of the loop.
    closing_ = true;
    std::string reason = over_budget ? "replies queued for all clients are over the budget of " +
                                           std::to_string(server_->options.max_queued_reply_bytes) +
                                           " bytes (--max-queued-reply-bytes) and this 1.x watcher "
                                           "does not read its events"
                                     : "more than " + std::to_string(kMaxPushedOutput) +
                                           " bytes of watch events queued and not read";
    boost::asio::post(server_->io, [self = shared_from_this(), reason] { self->close(reason); });
    return;
  }
  put_u8(out_, event);
  put_bytes(out_, key);
  put_bytes(out_, old_value);
  put_bytes(out_, new_value);
  flush();
}

void Connection::flush() {
  send_queued();
  account_output();
}

bool Connection::drain_unread() {
  for (;;) {
    if (closed_) return false;
    if (backlog() > kMaxQueuedOutput) {
      flush();
      if (writing_) {  // the socket is full: read again once the write drained
        read_paused_ = true;
        return false;
      }
    }
    if (unread_.empty()) return true;
    std::string pending = std::exchange(unread_, std::string());
    if (!process(pending.data(), pending.size())) return false;
  }
}

void Connection::written(const boost::system::error_code& ec) {
  writing_ = false;
  in_flight_ = 0;
  if (closed_) return;
  if (ec) {
    close();  // the peer went away; nothing to tell it
    return;
  }
  flush();
  if (read_paused_ && backlog() <= kMaxQueuedOutput / 2) {
    read_paused_ = false;
    resume_reading();
  }
}

}  // namespace ddp::store
