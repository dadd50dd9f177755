#include "ddp/launcher/master_endpoint.hpp"

#include <boost/asio/ip/tcp.hpp>

namespace ddp::launcher {
namespace {

class ReservedPort : public MasterHost {
 public:
  explicit ReservedPort(MasterEndpoint endpoint) : endpoint_(std::move(endpoint)) {}
  MasterEndpoint endpoint() const override { return endpoint_; }

 private:
  MasterEndpoint endpoint_;
};

int free_tcp_port(boost::asio::io_context& io) {
  using boost::asio::ip::tcp;
  tcp::acceptor probe(io);
  probe.open(tcp::v4());
  probe.bind(tcp::endpoint(tcp::v4(), 0));
  return probe.local_endpoint().port();
}

}  // namespace

std::unique_ptr<MasterHost> reserve_master_port(boost::asio::io_context& io,
                                                const LaunchConfig& config) {
  MasterEndpoint endpoint;
  endpoint.addr = config.local_addr.empty() ? config.master_addr : config.local_addr;
  endpoint.port = config.master_port && *config.master_port != 0 ? *config.master_port
                                                                 : free_tcp_port(io);
  return std::make_unique<ReservedPort>(std::move(endpoint));
}

}  // namespace ddp::launcher
