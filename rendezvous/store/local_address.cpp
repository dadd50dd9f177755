#include "ddp/store/local_address.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>

namespace ddp::store {

std::string local_address_towards(const std::string& host, int port) {
  try {
    boost::asio::io_context io;
    boost::asio::ip::udp::resolver resolver(io);
    auto endpoints = resolver.resolve(host, std::to_string(port));
    for (const auto& entry : endpoints) {
      boost::asio::ip::udp::socket socket(io);
      boost::system::error_code error;
      socket.open(entry.endpoint().protocol(), error);
      if (error) continue;
      socket.connect(entry.endpoint(), error);  // UDP: picks the route, sends nothing
      if (error) continue;
      return socket.local_endpoint().address().to_string();
    }
  } catch (const boost::system::system_error&) {
  }
  return {};
}

}  // namespace ddp::store
