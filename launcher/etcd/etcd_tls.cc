#include "launcher/etcd/etcd_tls.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "runtime/check.h"
#include "runtime/text.h"

namespace keel {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, Free>;

[[noreturn]] void fail(const std::string& what) {
  char buf[256] = "no reason";
  if (unsigned long e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof(buf));
  throw Error("etcd TLS: " + what + ": " + buf);
}

void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

void add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  check(ext != nullptr && X509_add_ext(cert, ext.get(), -1) == 1, "extension " + value);
}

Owned<X509> new_cert(const std::string& cn, long serial, EVP_PKEY* subject_key) {
  Owned<X509> x(X509_new());
  check(x != nullptr, "X509_new");
  check(X509_set_version(x.get(), 2) == 1, "X509_set_version");
  check(ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial) == 1, "serial");
  // Valid from a day ago (clocks of machines differ) for ten years: a job's certificates
  // live as long as the job.
  check(X509_gmtime_adj(X509_getm_notBefore(x.get()), -86400) != nullptr, "notBefore");
  check(X509_gmtime_adj(X509_getm_notAfter(x.get()), 10L * 365 * 86400) != nullptr, "notAfter");
  X509_NAME* name = X509_get_subject_name(x.get());
  check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                   0) == 1,
        "subject");
  check(X509_set_pubkey(x.get(), subject_key) == 1, "X509_set_pubkey");
  return x;
}

std::string pem(X509* x) {
  Owned<BIO> b(BIO_new(BIO_s_mem()));
  check(b && PEM_write_bio_X509(b.get(), x) == 1, "PEM of a certificate");
  char* data = nullptr;
  const long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string pem(EVP_PKEY* k) {
  Owned<BIO> b(BIO_new(BIO_s_mem()));
  check(b && PEM_write_bio_PrivateKey(b.get(), k, nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "PEM of a key");
  char* data = nullptr;
  const long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// A file only this user reads, made anew: whatever was at `path` (an earlier member's file,
// or a link planted to make keel write its key elsewhere) is removed first, and the new one is
// created exclusively, never through a link, with mode 0600 from its first byte.
void write_private(const std::string& path, const std::string& text) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    throw Error("etcd TLS: cannot replace " + path + ": " + std::strerror(errno));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("etcd TLS: cannot write " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  const int e = errno;
  if (::close(fd) != 0 || done != text.size())
    throw Error("etcd TLS: cannot write " + path + ": " + std::strerror(e));
}

// The certificates' folder is this user's alone: a folder another user made (or a link to
// one) at a predictable name would let it swap the files between their write and etcd's read.
void check_private_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) throw Error("etcd TLS: " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
    throw Error(detail::concat(
        "etcd TLS: ", dir, " is refused: ", S_ISDIR(st.st_mode) ? "" : "not a folder (a link?), ",
        "owned by uid ", st.st_uid, ", not this user (uid ", ::geteuid(), ")"));
}

}  // namespace

EtcdTlsCerts issue_etcd_certs(const std::string& ip, const JobKey& key) {
  // The CA: the same key and name in every process of the job, so that a certificate any of
  // them issued verifies against the CA certificate any other one made. No key identifiers:
  // chains are matched by the issuer's name.
  const JobKey::Bytes seed = key.derive("keel-etcd-ca/1");
  Owned<EVP_PKEY> ca_key(
      EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), seed.size()));
  check(ca_key != nullptr, "the CA key");
  Owned<X509> ca = new_cert("keel job CA", 1, ca_key.get());
  check(X509_set_issuer_name(ca.get(), X509_get_subject_name(ca.get())) == 1, "CA issuer");
  add_ext(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE");
  add_ext(ca.get(), ca.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  check(X509_sign(ca.get(), ca_key.get(), nullptr) > 0, "signing the CA");

  Owned<EVP_PKEY> leaf_key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  check(leaf_key != nullptr, "a leaf key");
  JobKey::Bytes serial_bytes = JobKey::generate().bytes();
  long serial = 2;
  for (int i = 0; i < 6; ++i) serial = (serial << 8) | serial_bytes[i];
  Owned<X509> leaf = new_cert(kEtcdServerName, serial, leaf_key.get());
  check(X509_set_issuer_name(leaf.get(), X509_get_subject_name(ca.get())) == 1, "leaf issuer");
  add_ext(leaf.get(), ca.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_ext(leaf.get(), ca.get(), NID_key_usage, "critical,digitalSignature");
  add_ext(leaf.get(), ca.get(), NID_ext_key_usage, "serverAuth,clientAuth");
  add_ext(leaf.get(), ca.get(), NID_subject_alt_name,
          std::string("DNS:") + kEtcdServerName + (ip.empty() ? "" : ",IP:" + ip));
  check(X509_sign(leaf.get(), ca_key.get(), nullptr) > 0, "signing a leaf");
  return {pem(ca.get()), pem(leaf.get()), pem(leaf_key.get())};
}

void write_etcd_certs(const EtcdTlsCerts& certs, const std::string& dir) {
  std::filesystem::create_directories(dir);
  check_private_dir(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace);
  write_private(dir + "/ca.pem", certs.ca_pem);
  write_private(dir + "/cert.pem", certs.cert_pem);
  write_private(dir + "/key.pem", certs.key_pem);
}

}  // namespace keel
