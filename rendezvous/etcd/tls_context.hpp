#pragma once
// The TLS settings of a client (ClientOptions' cacert, cert, key) as an OpenSSL context.

#include <boost/asio/ssl/context.hpp>
#include <memory>

#include "ddp/etcd/client.hpp"

namespace ddp::etcd::detail {

// Verifies members against cacert (the system's CAs when empty) and presents cert/key when
// given. Throws EtcdError(kRefused) naming a file that is missing or not PEM.
std::unique_ptr<boost::asio::ssl::context> make_tls_context(const ClientOptions& options);

}  // namespace ddp::etcd::detail
