// TLS for the etcd members keel starts and their clients: a per-job certificate authority
// whose Ed25519 key derives from the job key (parallel/job_key.h), so that every process of
// the job can issue itself a certificate and trust its peers' with no file to hand around
// but the job's secret. Members require client certificates (--client-cert-auth, also between
// peers): a process without the job key cannot read or write the job's control state.
#pragma once

#include <string>

#include "parallel/job_key.h"

namespace keel {

// The name every member's certificate carries (besides its IP address) and every client
// checks: clients reach members by IP address, which a certificate may name too.
inline constexpr const char* kEtcdServerName = "keel-etcd";

// PEM text of the job's CA certificate and of one leaf certificate and its private key.
struct EtcdTlsCerts {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};

// A fresh leaf certificate (its own random key) signed by the job's CA, for server and
// client use, naming kEtcdServerName and, if not empty, the IPv4 address `ip`. Throws
// keel::Error with OpenSSL's reason if it cannot be made.
EtcdTlsCerts issue_etcd_certs(const std::string& ip, const JobKey& key = process_job_key());

// Writes `certs` as ca.pem, cert.pem and key.pem (mode 0600) into `dir` (created, mode 0700).
// Each file is made anew (whatever was at its name removed first, never written through a
// link); a `dir` that is not this user's own folder (another user's, or a link) is refused
// with keel::Error naming it.
void write_etcd_certs(const EtcdTlsCerts& certs, const std::string& dir);

}  // namespace keel
