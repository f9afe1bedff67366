#include "launcher/worker/store_address.h"

#include "launcher/etcd/etcd_store.h"
#include "parallel/tcp_store.h"
#include "runtime/check.h"

namespace keel {

StoreAddress store_at(const std::string& address) {
  StoreAddress a;
  if (is_etcd_store_address(address)) {
    connect_etcd_store(address);  // checks the form now, not in the first caller's thread
    a.connect = [address] { return connect_etcd_store(address); };
    // Local reads: the runtime-fault poll goes on while etcd has no quorum.
    a.connect_step_path = [address] {
      return connect_etcd_store(address, kEtcdQuickCall, EtcdRead::kLocal);
    };
    // "etcd://host:port,...": the first member's host.
    const size_t from = address.find("//") + 2;
    a.toward_host = address.substr(from, address.find(':', from) - from);
    return a;
  }
  auto [host, port] = parse_host_port(address);
  a.connect = [host = host, port = port] { return std::make_shared<TcpStore>(host, port); };
  a.connect_step_path = a.connect;
  a.toward_host = host;
  return a;
}

}  // namespace keel
