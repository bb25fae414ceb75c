// Addresses and ports for rendezvous on one or several hosts.
#pragma once

#include <string>

namespace pipetrain::comm {

// A TCP port that was free on `host` a moment ago (bind to port 0, read it back, close).
int find_free_port(const std::string& host = "127.0.0.1");

// Whether `host` (a name or address) resolves to a loopback address.
bool is_loopback_host(const std::string& host);

// The address of this host that a peer can reach it by: 127.0.0.1 when `master_addr` is
// loopback, else the local address of the interface that routes to `master_addr`.
// ConfigError when master_addr does not resolve.
std::string local_address_towards(const std::string& master_addr);

}  // namespace pipetrain::comm
