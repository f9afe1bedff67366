#include "launcher/controller_wait.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "launcher/agent/agent.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// How often keel-launch looks at its controller and slots while the job runs.
constexpr std::chrono::milliseconds kControllerPoll{20};

// The job's exit status if every slot this process runs has ended with it (the shutdown a
// leader sends carries it), looked at without reaping them (WNOWAIT): the waits after this one
// reap them and read the same. None while a slot runs, or if one ended otherwise (killed,
// taken as lost, its controller silent).
std::optional<int> slots_ended_with_job(const std::vector<pid_t>& slots,
                                        const std::atomic<int>& agent0_code, bool agent0_here) {
  auto job_status = [](int code) { return code != kExitControllerLost && code != kExitSlotGone; };
  if (agent0_here) {
    const int code = agent0_code.load();
    return code >= 0 && job_status(code) ? std::optional<int>(code) : std::nullopt;
  }
  std::optional<int> code;
  for (pid_t p : slots) {
    siginfo_t info{};
    if (waitid(P_PID, id_t(p), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != p ||
        info.si_code != CLD_EXITED || !job_status(info.si_status))
      return std::nullopt;
    if (!code) code = info.si_status;
  }
  return code;
}

// How long the controller may outlive every slot here that ended with the job's status: its
// own end takes its agents' shutdown (kShutdownGrace twice, lead.cc) and then exits.
constexpr std::chrono::seconds kOutlivesTheJob{5};

}  // namespace

int wait_controller(pid_t controller, const std::vector<pid_t>& slots,
                    const std::atomic<int>& agent0_code, bool agent0_here,
                    const volatile sig_atomic_t* signal, std::optional<int>* job_code) {
  bool passed = false;
  std::optional<std::chrono::steady_clock::time_point> job_ended;
  while (true) {
    int st = 0;
    const pid_t r = waitpid(controller, &st, WNOHANG);
    if (r == controller) return st;
    KEEL_CHECK(r == 0 || (r < 0 && errno == EINTR), "waitpid of the controller (pid ", controller,
               "): ", std::strerror(errno));
    if (*signal && !passed) {
      ::kill(controller, int(*signal));
      passed = true;
    }
    if (const auto code = slots_ended_with_job(slots, agent0_code, agent0_here)) {
      const auto now = std::chrono::steady_clock::now();
      if (!job_ended) job_ended = now;
      if (now - *job_ended > kOutlivesTheJob) {
        LOG(WARNING) << "the job ended (exit " << *code << ") under another leader while its first "
                     << "controller (pid " << controller << "), deposed without learning it, "
                     << "still ran: stopping it";
        ::kill(controller, SIGKILL);
        waitpid(controller, &st, 0);
        *job_code = code;
        return st;
      }
    }
    std::this_thread::sleep_for(kControllerPoll);
  }
}

}  // namespace keel
