// The etcd members' certificate files (launcher/etcd/etcd_tls.h) against what a local
// intruder plants at their predictable names: a link where a file will be written, a link
// where the folder will be.
#include "launcher/etcd/etcd_tls.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/check.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("keel-etcd-tls-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

TEST(EtcdTls, FilesAreThisUsersAloneAndAPlantedLinkIsNotWrittenThrough) {
  TempDir t;
  const std::string dir = (t.path / "certs").string();
  fs::create_directories(dir);
  const std::string elsewhere = (t.path / "elsewhere").string();
  std::ofstream(elsewhere) << "not keel's";
  fs::create_symlink(elsewhere, dir + "/key.pem");  // planted: the key would land there
  write_etcd_certs(issue_etcd_certs("127.0.0.1"), dir);
  EXPECT_EQ(slurp(elsewhere), "not keel's");
  EXPECT_FALSE(fs::is_symlink(dir + "/key.pem"));
  for (const char* f : {"ca.pem", "cert.pem", "key.pem"}) {
    struct stat st {};
    ASSERT_EQ(::stat((dir + "/" + f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
  }
  EXPECT_NE(slurp(dir + "/key.pem").find("PRIVATE KEY"), std::string::npos);
  struct stat d {};
  ASSERT_EQ(::stat(dir.c_str(), &d), 0);
  EXPECT_EQ(d.st_mode & 0777, 0700u);
}

TEST(EtcdTls, AFolderThatIsALinkIsRefused) {
  TempDir t;
  const std::string target = (t.path / "theirs").string(), link = (t.path / "certs").string();
  fs::create_directories(target);
  fs::create_directory_symlink(target, link);
  try {
    write_etcd_certs(issue_etcd_certs("127.0.0.1"), link);
    ADD_FAILURE() << "certificates written through a linked folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a folder"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(target));
}

}  // namespace
}  // namespace keel
