#include "tls_context.hpp"

#include <fstream>

namespace ddp::etcd::detail {
namespace {

using Kind = EtcdError::Kind;

void check_readable(const std::string& what, const std::string& path) {
  if (path.empty()) return;
  std::ifstream file(path);
  if (!file) {
    throw EtcdError(Kind::kRefused, "etcd TLS: cannot read " + what + "=" + path +
                                        " (give the path of a readable PEM file)");
  }
}

}  // namespace

std::unique_ptr<boost::asio::ssl::context> make_tls_context(const ClientOptions& options) {
  namespace ssl = boost::asio::ssl;
  check_readable("cacert", options.cacert);
  check_readable("cert", options.cert);
  check_readable("key", options.key);
  if (options.cert.empty() != options.key.empty()) {
    throw EtcdError(Kind::kRefused,
                    "etcd TLS: give both cert= and key= (the client's "
                    "certificate and its private key), or neither");
  }
  auto context = std::make_unique<ssl::context>(ssl::context::tls_client);
  context->set_verify_mode(ssl::verify_peer);
  auto load = [&](const char* what, const std::string& path, auto action) {
    try {
      action();
    } catch (const boost::system::system_error& e) {
      throw EtcdError(Kind::kRefused, std::string("etcd TLS: cannot use ") + what + "=" + path +
                                          ": " + e.code().message() + " (is it a PEM file?)");
    }
  };
  if (options.cacert.empty()) {
    context->set_default_verify_paths();
  } else {
    load("cacert", options.cacert, [&] { context->load_verify_file(options.cacert); });
  }
  if (!options.cert.empty()) {
    load("cert", options.cert, [&] { context->use_certificate_chain_file(options.cert); });
    load("key", options.key,
         [&] { context->use_private_key_file(options.key, ssl::context::pem); });
  }
  return context;
}

}  // namespace ddp::etcd::detail
