// capture_stacks on real child processes: a spinning one, a blocked one with a second
// thread, one stopped by SIGSTOP (it must stay stopped), and the error cases.
#include "launcher/stack_capture.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

// Functions the children sit in, named so the test can find them in the stacks. noinline,
// and work after each call, so that neither inlining nor a tail call hides them.
extern "C" [[gnu::noinline]] void keel_test_spin_forever(volatile uint64_t* counter) {
  while (true) {
    *counter = *counter + 1;
    asm volatile("" ::: "memory");
  }
}

namespace keel_test {
[[gnu::noinline]] char blocked_in_read(int fd) {
  char c = 0;
  while (::read(fd, &c, 1) != 1) {
  }
  asm volatile("" ::: "memory");
  return c;
}
[[gnu::noinline]] void* helper_thread(void* arg) {
  const int fd = *static_cast<int*>(arg);
  pollfd p{fd, POLLIN, 0};
  while (true) {
    ::poll(&p, 1, -1);
    asm volatile("" ::: "memory");
  }
  return nullptr;
}
[[gnu::noinline]] void paused_forever() {
  while (true) {
    ::pause();
    asm volatile("" ::: "memory");
  }
}
}  // namespace keel_test

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// A forked child running `body`, killed and reaped when the test ends, whatever happens.
class Child {
 public:
  explicit Child(const std::function<void()>& body) {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      body();
      _exit(0);
    }
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  pid_t pid() const { return pid_; }
  void reaped() { reaped_ = true; }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) r = fds[0], w = fds[1];
  }
  ~Pipe() {
    if (r >= 0) close(r);
    if (w >= 0) close(w);
  }
};

char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
}

bool wait_for_state(pid_t pid, char state, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (process_state(pid) == state) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return process_state(pid) == state;
}

bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

bool has_frame(const ThreadStack& t, const std::string& function) {
  for (const auto& f : t.frames)
    if (f.rfind(function, 0) == 0) return true;
  return false;
}

std::string dump(const ProcessStacks& s) {
  return format_stacks(s);
}

// Captures until the main thread shows `function` (a child may still be on its way there).
ProcessStacks capture_until(pid_t pid, const std::string& function) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  ProcessStacks s;
  do {
    s = capture_stacks(pid, std::chrono::seconds(2));
    if (!s.threads.empty() && has_frame(s.threads[0], function)) break;
  } while (Clock::now() < deadline);
  return s;
}

TEST(StackCapture, SpinningChildIsSeenInItsFunctionAndRunsOn) {
  auto* counter = static_cast<volatile uint64_t*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(counter, MAP_FAILED);
  *counter = 0;
  Child child([&] { keel_test_spin_forever(counter); });
  ASSERT_GT(child.pid(), 0);

  const ProcessStacks s = capture_until(child.pid(), "keel_test_spin_forever+0x");
  EXPECT_EQ(s.error, "");
  ASSERT_EQ(s.threads.size(), 1u) << dump(s);
  EXPECT_EQ(s.threads[0].tid, child.pid());
  EXPECT_EQ(s.threads[0].error, "");
  ASSERT_FALSE(s.threads[0].frames.empty());
  // The innermost frame is the loop itself, in the test binary; no raw addresses in it.
  EXPECT_EQ(s.threads[0].frames[0].rfind("keel_test_spin_forever+0x", 0), 0u) << dump(s);
  EXPECT_NE(s.threads[0].frames[0].find("(keel_launcher_test)"), std::string::npos) << dump(s);

  // Still running after the capture: the counter moves on.
  const uint64_t before = *counter;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (*counter == before && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_NE(*counter, before);
  EXPECT_NE(process_state(child.pid()), 'T');
  munmap(const_cast<uint64_t*>(counter), 4096);
}

TEST(StackCapture, BlockedChildShowsEveryThreadDemangled) {
  Pipe in, ready;
  Child child([&] {
    static int fd = in.r;
    pthread_t t;
    if (pthread_create(&t, nullptr, keel_test::helper_thread, &fd) != 0) _exit(3);
    if (write(ready.w, "x", 1) != 1) _exit(4);
    keel_test::blocked_in_read(in.r);
  });
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(readable_within(ready.r, 5000));

  const ProcessStacks s = capture_until(child.pid(), "keel_test::blocked_in_read(int)+0x");
  ASSERT_EQ(s.error, "");
  ASSERT_EQ(s.threads.size(), 2u) << dump(s);
  EXPECT_EQ(s.threads[0].tid, child.pid()) << "the main thread comes first";
  EXPECT_TRUE(has_frame(s.threads[0], "keel_test::blocked_in_read(int)+0x")) << dump(s);
  // The helper thread may still be on its way into poll(); wait for it too.
  ProcessStacks h = s;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!has_frame(h.threads[1], "keel_test::helper_thread(void*)+0x") && Clock::now() < deadline)
    h = capture_stacks(child.pid(), std::chrono::seconds(2));
  EXPECT_TRUE(has_frame(h.threads[1], "keel_test::helper_thread(void*)+0x")) << dump(h);
  // No absolute addresses: equal stacks of two processes must read the same.
  const std::regex address("0x[0-9a-f]{9,}");
  for (const auto& t : h.threads)
    for (const auto& f : t.frames) EXPECT_FALSE(std::regex_search(f, address)) << f;

  // It goes on as before: it reads what we write.
  ASSERT_EQ(write(in.w, "y", 1), 1);
  int st = 0;
  ASSERT_EQ(waitpid(child.pid(), &st, 0), child.pid());
  child.reaped();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(StackCapture, StoppedChildStaysStoppedAndCanBeContinued) {
  Pipe in, out;
  Child child([&] {
    const char c = keel_test::blocked_in_read(in.r);
    if (write(out.w, &c, 1) != 1) _exit(4);
  });
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(wait_for_state(child.pid(), 'S', std::chrono::seconds(30)));
  ASSERT_EQ(::kill(child.pid(), SIGSTOP), 0);
  ASSERT_TRUE(wait_for_state(child.pid(), 'T', std::chrono::seconds(30)));

  const ProcessStacks s = capture_stacks(child.pid(), std::chrono::seconds(2));
  ASSERT_EQ(s.error, "");
  ASSERT_EQ(s.threads.size(), 1u) << dump(s);
  EXPECT_TRUE(has_frame(s.threads[0], "keel_test::blocked_in_read(int)+0x")) << dump(s);

  // Stopped it stays: the byte we send is not read until SIGCONT.
  ASSERT_TRUE(wait_for_state(child.pid(), 'T', std::chrono::seconds(30)));
  ASSERT_EQ(write(in.w, "z", 1), 1);
  EXPECT_FALSE(readable_within(out.r, 200));
  EXPECT_EQ(process_state(child.pid()), 'T');
  ASSERT_EQ(::kill(child.pid(), SIGCONT), 0);
  ASSERT_TRUE(readable_within(out.r, 30000));
  char c = 0;
  ASSERT_EQ(read(out.r, &c, 1), 1);
  EXPECT_EQ(c, 'z');
}

TEST(StackCapture, ExitedChildIsAnErrorAndItsStatusStaysWithTheParent) {
  Child child([] { _exit(7); });
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(wait_for_state(child.pid(), 'Z', std::chrono::seconds(30)));
  const ProcessStacks s = capture_stacks(child.pid(), std::chrono::milliseconds(500));
  EXPECT_TRUE(s.threads.empty() || !s.error.empty() || !s.threads[0].error.empty()) << dump(s);
  int st = 0;
  ASSERT_EQ(waitpid(child.pid(), &st, 0), child.pid());
  child.reaped();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7);
}

TEST(StackCapture, ErrorsAreValues) {
  const ProcessStacks none = capture_stacks(0, std::chrono::milliseconds(100));
  EXPECT_NE(none.error, "");
  // A process that no longer exists (a child we reaped: its pid is free).
  Child gone([] { _exit(0); });
  int st = 0;
  ASSERT_EQ(waitpid(gone.pid(), &st, 0), gone.pid());
  gone.reaped();
  const ProcessStacks missing = capture_stacks(gone.pid(), std::chrono::milliseconds(100));
  EXPECT_NE(missing.error, "");
  EXPECT_TRUE(missing.threads.empty());
  // Our own process cannot be traced by itself.
  const ProcessStacks self = capture_stacks(getpid(), std::chrono::milliseconds(100));
  EXPECT_NE(self.error.find("cannot trace"), std::string::npos) << self.error;
}

// The body of the child of ReplacedBinaryIsStillRead (KEEL_TEST_STACK_CHILD set).
TEST(StackCaptureChild, PausedForever) {
  if (!std::getenv("KEEL_TEST_STACK_CHILD")) GTEST_SKIP() << "runs only as a child";
  keel_test::paused_forever();
}

TEST(StackCapture, ReplacedBinaryIsStillRead) {
  // A copy of this test binary runs the child, and is then replaced on disk, as a rebuild
  // replaces keel-worker under a running job.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("keel-stack-exe-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path copy = dir / "keel_launcher_test-copy";
  fs::copy_file("/proc/self/exe", copy, fs::copy_options::overwrite_existing);
  Child child([&] {
    setenv("KEEL_TEST_STACK_CHILD", "1", 1);
    const std::string prog = copy.string(), filter = "--gtest_filter=StackCaptureChild.*";
    char* argv[] = {const_cast<char*>(prog.c_str()), const_cast<char*>(filter.c_str()), nullptr};
    execv(argv[0], argv);
    _exit(127);
  });
  ASSERT_GT(child.pid(), 0);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  std::error_code ec;
  while (fs::read_symlink("/proc/" + std::to_string(child.pid()) + "/exe", ec) != copy &&
         Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  fs::remove(copy);
  fs::copy_file("/bin/true", copy);  // another binary under the same name

  const ProcessStacks s = capture_until(child.pid(), "keel_test::paused_forever()+0x");
  fs::remove_all(dir);
  ASSERT_EQ(s.error, "");
  ASSERT_FALSE(s.threads.empty());
  const ThreadStack& main = s.threads[0];
  EXPECT_TRUE(has_frame(main, "keel_test::paused_forever()+0x")) << dump(s);
  // Unwound through the replaced binary all the way out, not stopped at its first frame.
  EXPECT_TRUE(has_frame(main, "main+0x")) << dump(s);
  for (const auto& f : main.frames) {
    if (f.rfind("keel_test::paused_forever()", 0) == 0) {
      EXPECT_NE(f.find(" (keel_launcher_test-copy)"), std::string::npos) << f;
    }
  }
}

TEST(StackCapture, ThreadsComingAndGoingNeverBreakTheCapture) {
  Child child([] {
    while (true) {
      std::thread t([] {});
      t.join();
    }
  });
  ASSERT_GT(child.pid(), 0);
  for (int i = 0; i < 50; ++i) {
    const ProcessStacks s = capture_stacks(child.pid(), std::chrono::seconds(1));
    ASSERT_EQ(s.error, "");
    ASSERT_FALSE(s.threads.empty());
    EXPECT_EQ(s.threads[0].tid, child.pid());
  }
  EXPECT_NE(process_state(child.pid()), 'T');
  EXPECT_NE(process_state(child.pid()), 't');
}

}  // namespace
}  // namespace keel
