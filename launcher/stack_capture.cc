#include "launcher/stack_capture.h"

#include <dirent.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include "launcher/stack_unwinder.h"
#include "runtime/check.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "state S, waiting in do_epoll_wait": why a thread did not stop, from what /proc says.
std::string thread_state(pid_t pid, int tid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
  const std::string stat = read_line(dir + "/stat");
  const auto paren = stat.rfind(')');
  std::string out = paren != std::string::npos && paren + 2 < stat.size()
                        ? std::string("state ") + stat[paren + 2]
                        : std::string("state unknown");
  const std::string wchan = read_line(dir + "/wchan");
  if (!wchan.empty() && wchan != "0") out += ", waiting in " + wchan;
  return out;
}

std::string errno_text(const char* what, int err) {
  return detail::concat(what, ": ", std::strerror(err));
}

// One thread of the capture, from PTRACE_SEIZE to PTRACE_DETACH.
struct Tracee {
  ThreadStack stack;
  bool seized = false;
  bool stopped = false;  // in a ptrace-stop: its registers and memory can be read
  bool gone = false;     // it exited during the capture
  int deliver = 0;       // a signal it was about to receive when it stopped: passed on
};

// Has `t` stopped (or exited) yet? Peeks first (WNOWAIT) so that the exit of the main
// thread, when the caller is the process's parent, stays for the caller's own waitpid.
void poll_tracee(pid_t pid, Tracee& t) {
  siginfo_t si{};
  if (waitid(P_PID, id_t(t.stack.tid), &si, WEXITED | WNOHANG | WNOWAIT | __WALL) == -1) {
    if (errno == ECHILD) {  // no longer ours to wait for: it is gone
      t.gone = true;
      t.stack.error = "exited during the capture";
    } else if (errno != EINTR) {
      t.gone = true;
      t.stack.error = errno_text("waitid", errno);
    }
    return;
  }
  if (si.si_pid == 0) return;  // still running toward its stop
  if (si.si_code != CLD_TRAPPED) {
    t.gone = true;
    t.stack.error = "exited during the capture";
    if (t.stack.tid == pid) return;
    // A traced thread that exits waits for its tracer to reap it.
    int status = 0;
    (void)waitpid(t.stack.tid, &status, WNOHANG | __WALL);
    return;
  }
  int status = 0;
  const pid_t got = waitpid(t.stack.tid, &status, WNOHANG | __WALL);
  if (got == -1) {
    t.gone = true;
    t.stack.error = errno_text("waitpid", errno);
    return;
  }
  if (got == 0 || !WIFSTOPPED(status)) return;
  t.stopped = true;
  // PTRACE_EVENT_STOP: our interrupt, or the group-stop of a stopped process (which the
  // kernel re-enters on detach). Anything else is a signal on its way in: deliver it.
  if ((status >> 16) != PTRACE_EVENT_STOP) t.deliver = WSTOPSIG(status);
}

std::vector<int> list_threads(pid_t pid, std::string* error) {
  std::vector<int> tids;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    *error = errno == ENOENT ? std::string("no such process") : errno_text(dir.c_str(), errno);
    return tids;
  }
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long tid = std::strtol(e->d_name, &end, 10);
    if (tid > 0 && *end == '\0') tids.push_back(int(tid));
  }
  ::closedir(d);
  // The main thread first (it is the training thread of a worker), then by id.
  std::sort(tids.begin(), tids.end(), [pid](int a, int b) {
    return std::make_pair(a != pid, a) < std::make_pair(b != pid, b);
  });
  return tids;
}

// The capture itself. It runs on a thread of its own, which is the tracer: when that thread
// ends, the kernel detaches whatever it still traces (a thread that never stopped), so no
// path out of here leaves a worker traced.
ProcessStacks capture_on_this_thread(pid_t pid, Clock::time_point deadline) {
  ProcessStacks out;
  out.pid = pid;
  const std::vector<int> tids = list_threads(pid, &out.error);
  if (!out.error.empty()) return out;
  std::vector<Tracee> ts(tids.size());
  int seized = 0, refused = 0;  // refused: the errno of a failed PTRACE_SEIZE (not ESRCH)
  for (size_t i = 0; i < tids.size(); ++i) {
    Tracee& t = ts[i];
    t.stack.tid = tids[i];
    t.stack.name = read_line(detail::concat("/proc/", pid, "/task/", tids[i], "/comm"));
    if (ptrace(PTRACE_SEIZE, t.stack.tid, nullptr, nullptr) == -1) {
      t.gone = true;
      if (errno != ESRCH) refused = errno;
      t.stack.error = errno == ESRCH ? std::string("exited during the capture")
                                     : errno_text("ptrace(PTRACE_SEIZE)", errno);
      continue;
    }
    t.seized = true;
    ++seized;
    if (ptrace(PTRACE_INTERRUPT, t.stack.tid, nullptr, nullptr) == -1) {
      t.gone = true;
      t.stack.error = errno == ESRCH ? std::string("exited during the capture")
                                     : errno_text("ptrace(PTRACE_INTERRUPT)", errno);
    }
  }
  if (seized == 0) {  // nothing to unwind: say why once, for the whole process
    const std::string state = thread_state(pid, pid);
    out.error = state == "state Z" ? std::string("the process has exited (not reaped yet)")
                : refused          ? detail::concat("cannot trace pid ", pid, ": ",
                                                    errno_text("ptrace(PTRACE_SEIZE)", refused))
                                   : std::string("no such process");
    return out;
  }

  // Every thread to its stop, so that the stacks are of one moment.
  for (auto pause = std::chrono::microseconds(50);;
       pause = std::min(pause * 2, std::chrono::microseconds(2000))) {
    bool waiting = false;
    for (Tracee& t : ts)
      if (t.seized && !t.stopped && !t.gone) {
        poll_tracee(pid, t);
        waiting = waiting || (!t.stopped && !t.gone);
      }
    if (!waiting || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
  }

  StackUnwinder unwinder(pid);
  for (Tracee& t : ts) {
    if (!t.stopped) {
      if (t.seized && !t.gone)
        t.stack.error = "did not stop within the timeout (" + thread_state(pid, t.stack.tid) + ")";
      continue;
    }
    if (Clock::now() >= deadline)
      t.stack.error = "not unwound: the capture ran out of time";
    else
      t.stack.error = unwinder.unwind(t.stack.tid, &t.stack.frames);
  }
  for (Tracee& t : ts) {
    if (!t.stopped) continue;  // detached when this thread ends
    if (ptrace(PTRACE_DETACH, t.stack.tid, nullptr, reinterpret_cast<void*>(long(t.deliver))) ==
            -1 &&
        errno != ESRCH && t.stack.error.empty())
      t.stack.error = errno_text("ptrace(PTRACE_DETACH)", errno);
  }
  for (Tracee& t : ts) out.threads.push_back(std::move(t.stack));
  return out;
}

}  // namespace

ProcessStacks capture_stacks(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  ProcessStacks out;
  out.pid = pid;
  if (pid <= 0) {
    out.error = detail::concat("no such process (pid ", pid, ")");
    return out;
  }
  try {
    std::thread tracer([&] {
      try {
        out = capture_on_this_thread(pid, deadline);
      } catch (const std::exception& e) {  // e.g. out of memory: a value, like the rest
        out.error = e.what();
      }
    });
    tracer.join();
  } catch (const std::system_error& e) {  // no thread to trace from
    out.error = detail::concat("cannot start the tracing thread: ", e.what());
  }
  return out;
}

std::vector<ProcessStacks> capture_stacks(const std::vector<pid_t>& pids,
                                          std::chrono::milliseconds timeout) {
  std::vector<ProcessStacks> out(pids.size());
  std::vector<std::thread> threads;
  size_t started = 0;
  try {
    for (; started < pids.size(); ++started)
      threads.emplace_back(
          [&out, &pids, i = started, timeout] { out[i] = capture_stacks(pids[i], timeout); });
  } catch (const std::system_error&) {  // out of threads: the rest one by one, below
  }
  for (auto& t : threads) t.join();
  for (size_t i = started; i < pids.size(); ++i) out[i] = capture_stacks(pids[i], timeout);
  return out;
}

std::string format_stacks(const ProcessStacks& stacks) {
  std::ostringstream os;
  os << "pid " << stacks.pid;
  if (!stacks.error.empty()) os << ": " << stacks.error;
  os << "\n";
  for (const ThreadStack& t : stacks.threads) {
    os << "thread " << t.tid << " (" << t.name << ")";
    if (!t.error.empty()) os << ": " << t.error;
    os << "\n";
    for (size_t i = 0; i < t.frames.size(); ++i) os << "  #" << i << " " << t.frames[i] << "\n";
  }
  return os.str();
}

control::RankStacks to_message(int rank, const ProcessStacks& stacks) {
  control::RankStacks m;
  m.set_rank(rank);
  m.set_pid(stacks.pid);
  m.set_error(stacks.error);
  for (const ThreadStack& t : stacks.threads) {
    control::ThreadStackMsg* tm = m.add_threads();
    tm->set_tid(t.tid);
    tm->set_name(t.name);
    tm->set_error(t.error);
    for (const auto& f : t.frames) tm->add_frames(f);
  }
  return m;
}

ProcessStacks from_message(const control::RankStacks& msg) {
  ProcessStacks s;
  s.pid = msg.pid();
  s.error = msg.error();
  for (const auto& tm : msg.threads()) {
    ThreadStack t;
    t.tid = tm.tid();
    t.name = tm.name();
    t.error = tm.error();
    t.frames.assign(tm.frames().begin(), tm.frames().end());
    s.threads.push_back(std::move(t));
  }
  return s;
}

}  // namespace keel
