// After all ckpt tests: no shared-memory segment of any job this test process made is left
// in /dev/shm (each test also checks its own job through JobGuard).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

namespace {

class ShmCleanEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string prefix = "keel-ckpttest" + std::to_string(::getpid()) + "x";
    DIR* dir = ::opendir("/dev/shm");
    ASSERT_NE(dir, nullptr);
    while (dirent* e = ::readdir(dir)) {
      std::string n = e->d_name;
      if (n.compare(0, prefix.size(), prefix) != 0) continue;
      ADD_FAILURE() << "/dev/shm/" << n << " left behind by a ckpt test";
      ::shm_unlink(("/" + n).c_str());
    }
    ::closedir(dir);
  }
};

[[maybe_unused]] ::testing::Environment* const kShmClean =
    ::testing::AddGlobalTestEnvironment(new ShmCleanEnvironment);

}  // namespace
