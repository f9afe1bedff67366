// keel-bench restore: how fast one rank's state comes back from its backup holder, and how
// much host memory the snapshots and backups of one rank take (issue 14, parts 4 and 5).
//
// For the medium GPT's TrainState (L6 d512 T256 V256: parameters + AdamW m + v, 230 MB) and
// a ~1 GB one (L28 d512), the benchmark writes a snapshot into the owner's segment, pushes
// it to a BackupServer, and times, best of --repeats:
//   fetch    BackupClient::fetch of that backup into a live state;
//   restore  restore_state() with no own slot (a lost segment, a promoted standby): the
//            whole path a worker takes, connection included;
// over loopback (server and client in this process, 127.0.0.1) and across two network
// namespaces (the server on "machine" 0, the client on machine 1, veth pairs on a bridge;
// needs root), each plain and sealed (AES-256-GCM, what keel does between machines), with
// the ratio of the two. GB/s counts payload bytes, 1 GB = 1e9 bytes. A last table gives the bytes
// of the rank's snapshot segment and of the backup segment a holder keeps for it.
//
//   keel-bench restore [--repeats 5] [--sizes medium,1g] [--no-netns]
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/scenarios.h"
#include "ckpt/backup_service.h"
#include "ckpt/checksum.h"
#include "ckpt/restore.h"
#include "ckpt/snapshot_region.h"
#include "integration/netns.h"
#include "model/train_state.h"
#include "parallel/sealed_channel.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_features.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

keel_param_desc desc(const std::string& name, std::vector<int64_t> shape) {
  keel_param_desc d;
  std::memset(&d, 0, sizeof(d));
  std::strncpy(d.name, name.c_str(), sizeof(d.name) - 1);
  d.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  d.tp_dim = -1;
  d.tp_blocks = 1;
  d.init = KEEL_INIT_ZEROS;
  return d;
}

// The parameters of the GPT plugin at L layers, width C, context T, vocabulary V (the same
// shapes and count; names shortened).
std::vector<keel_param_desc> gpt_params(int L, int64_t C, int64_t T, int64_t V) {
  std::vector<keel_param_desc> d = {desc("wte", {V, C}), desc("wpe", {T, C})};
  for (int l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (auto [n, s] :
         std::vector<std::pair<const char*, std::vector<int64_t>>>{{"ln1.w", {C}},
                                                                   {"ln1.b", {C}},
                                                                   {"qkv.w", {3 * C, C}},
                                                                   {"qkv.b", {3 * C}},
                                                                   {"proj.w", {C, C}},
                                                                   {"proj.b", {C}},
                                                                   {"ln2.w", {C}},
                                                                   {"ln2.b", {C}},
                                                                   {"fc.w", {4 * C, C}},
                                                                   {"fc.b", {4 * C}},
                                                                   {"fcproj.w", {C, 4 * C}},
                                                                   {"fcproj.b", {C}}})
      d.push_back(desc(h + n, s));
  }
  d.push_back(desc("lnf.w", {C}));
  d.push_back(desc("lnf.b", {C}));
  return d;
}

struct Size {
  std::string key, label;
  int layers;
};

// Every byte written, so no page of the state is the shared zero page and the timings see
// real memory.
void fill(TrainState& s, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (const StateSpan& span : s.spans())
    for (size_t i = 0; i < span.floats; ++i) {
      x = x * 1664525u + 1013904223u;
      span.data[i] = static_cast<float>(x >> 8) / 65536.0f;
    }
}

uint64_t state_checksum(TrainState& s) {
  ChecksumStream sum;
  for (const StateSpan& span : s.spans()) sum.update(span.data, span.bytes());
  return sum.digest();
}

size_t segment_bytes(const std::string& name) {
  struct stat st {};
  if (::stat(("/dev/shm" + name).c_str(), &st) != 0) return 0;
  return static_cast<size_t>(st.st_size);
}

// CPU seconds of every thread of this process (the server's and the client's).
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct Timing {
  double best = 1e30, first = 0;
  double cpu = 1e30;  // the least CPU seconds of one run, both ends together
};

// Runs `once` `repeats` times; each returns its seconds. CPU time tells the cost apart from
// the wait for cores that other jobs on the machine take.
Timing time_it(int repeats, const std::function<double()>& once) {
  Timing t;
  for (int i = 0; i < repeats; ++i) {
    const double c0 = cpu_seconds();
    const double s = once();
    t.cpu = std::min(t.cpu, cpu_seconds() - c0);
    if (i == 0) t.first = s;
    t.best = std::min(t.best, s);
  }
  return t;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Row {
  std::string state, path, op;
  size_t bytes;
  Timing t;
};

struct MemRow {
  std::string state;
  size_t state_bytes, own_segment, backup_segment;
};

// Runs `fn` where the client of `path` lives.
using Place = std::function<void(const std::function<void()>&)>;

void bench_path(const std::string& job, const Size& size, TrainState& owner, TrainState& target,
                int repeats, const std::string& path, const std::string& server_host,
                const Place& on_server, const Place& on_client, std::vector<Row>* rows) {
  std::unique_ptr<BackupServer> server;
  on_server([&] {
    BackupServerOptions o;
    o.host = server_host;
    server = std::make_unique<BackupServer>(job, 1, o);
  });
  const std::string addr = server->address();
  const int64_t step = 7;
  auto own = SnapshotRegion::open_existing(snapshot_segment_name(job, 0), /*writable=*/true);
  const uint64_t want = own->find(step)->checksum;
  on_client([&] { BackupClient(addr, 60s).push(*own, step); });

  auto check = [&](const char* op) {
    if (state_checksum(target) != want) {
      std::fprintf(stderr, "keel-bench restore: %s over %s returned other bytes\n", op,
                   path.c_str());
      unlink_job_segments(job);
      std::exit(1);
    }
  };
  Row fetch{size.label, path, "fetch", owner.bytes(), {}};
  on_client([&] {
    BackupClient client(addr, 60s);
    fetch.t = time_it(repeats, [&] {
      std::string why;
      const auto t0 = Clock::now();
      const bool ok = client.fetch(0, step, target, &why);
      const double s = seconds_since(t0);
      if (!ok) {
        std::fprintf(stderr, "keel-bench restore: fetch failed: %s\n", why.c_str());
        unlink_job_segments(job);
        std::exit(1);
      }
      return s;
    });
  });
  check("fetch");
  rows->push_back(fetch);
  std::printf("  %-22s %-14s %-8s %6.3f GB/s\n", size.label.c_str(), path.c_str(), "fetch",
              double(fetch.bytes) / fetch.t.best / 1e9);
  std::fflush(stdout);

  Row restore{size.label, path, "restore", owner.bytes(), {}};
  on_client([&] {
    restore.t = time_it(repeats, [&] {
      const auto t0 = Clock::now();
      restore_state(target, step, nullptr, addr, 0, 1, 60s);
      return seconds_since(t0);
    });
  });
  check("restore_state");
  rows->push_back(restore);
  std::printf("  %-22s %-14s %-8s %6.3f GB/s\n", size.label.c_str(), path.c_str(), "restore",
              double(restore.bytes) / restore.t.best / 1e9);
  std::fflush(stdout);
  server.reset();
}

struct RestoreOptions {
  int repeats = 5;
  std::vector<std::string> sizes = {"medium", "1g"};
  bool no_netns = false;
};

int restore_main(const RestoreOptions& o) {
  const int repeats = o.repeats;
  bool netns = !o.no_netns;
  const std::vector<Size> all = {{"medium", "medium L6 d512", 6}, {"1g", "~1 GB L28 d512", 28}};
  std::vector<Size> chosen;
  for (const std::string& k : o.sizes)
    for (const Size& s : all)
      if (s.key == k) chosen.push_back(s);

  // Output piped into `head` must not kill the benchmark before it removes its segments.
  std::signal(SIGPIPE, SIG_IGN);
  std::string why_not;
  if (netns && !test::NetnsLab::available(&why_not)) {
    std::printf("(no network namespaces: %s)\n", why_not.c_str());
    netns = false;
  }
  std::unique_ptr<test::NetnsLab> lab;
  if (netns) lab = std::make_unique<test::NetnsLab>(2);

  std::printf("== restore one rank from its backup holder: %s, %ld cores, best of %d\n",
              cpu_features().describe().c_str(), ::sysconf(_SC_NPROCESSORS_ONLN), repeats);
  std::fflush(stdout);
  const std::string job = "benchrestore" + std::to_string(::getpid());
  auto backend = make_cpu_backend(1);
  std::vector<Row> rows;
  std::vector<MemRow> mem;
  const Place here = [](const std::function<void()>& fn) { fn(); };
  for (const Size& size : chosen) {
    auto make = [&] {
      return std::make_unique<TrainState>(backend.get(), gpt_params(size.layers, 512, 256, 256), 0,
                                          1, 1, false);
    };
    auto owner = make();
    auto target = make();
    fill(*owner, 1);
    fill(*target, 2);
    {
      auto own = SnapshotRegion::open_or_create(snapshot_segment_name(job, 0), owner->bytes(),
                                                owner->layout_fingerprint(), 0);
      own->write(*owner, 6);  // both slots used, as on a rank that snapshots every step
      own->write(*owner, 7);
    }
    // Each path plain and sealed (AES-256-GCM, parallel/sealed_channel.h), one after the
    // other, so that the ratio compares runs on the same machine at the same time.
    for (const SealPolicy seal : {SealPolicy::kNever, SealPolicy::kAlways}) {
      set_seal_policy(seal);
      const std::string tag = seal == SealPolicy::kAlways ? "+seal" : "";
      bench_path(job, size, *owner, *target, repeats, "loopback" + tag, "127.0.0.1", here, here,
                 &rows);
      if (lab) {
        bench_path(
            job, size, *owner, *target, repeats, "netns" + tag, lab->address(0),
            [&](const std::function<void()>& fn) { lab->run_in(0, fn); },
            [&](const std::function<void()>& fn) { lab->run_in(1, fn); }, &rows);
      }
    }
    set_seal_policy(SealPolicy::kBetweenMachines);
    mem.push_back({size.label, owner->bytes(), segment_bytes(snapshot_segment_name(job, 0)),
                   segment_bytes(backup_segment_name(job, 1))});
    unlink_job_segments(job);
  }
  lab.reset();

  std::printf("\n%-16s %8s %-14s %-8s %8s %7s %11s %12s\n", "state", "MB", "path", "op", "best s",
              "GB/s", "first GB/s", "CPU s/GB");
  for (const Row& r : rows)
    std::printf("%-16s %8.1f %-14s %-8s %8.4f %7.3f %11.3f %12.3f\n", r.state.c_str(),
                r.bytes / 1e6, r.path.c_str(), r.op.c_str(), r.t.best,
                double(r.bytes) / r.t.best / 1e9, double(r.bytes) / r.t.first / 1e9,
                r.t.cpu / (double(r.bytes) / 1e9));
  // What sealing costs: sealed over plain on the same path, state and operation.
  std::printf("\nsealed / plain GB/s (1.00: no cost; between machines keel seals by default):\n");
  for (const Row& r : rows) {
    const size_t plus = r.path.find("+seal");
    if (plus == std::string::npos) continue;
    for (const Row& p : rows)
      if (p.state == r.state && p.op == r.op && p.path == r.path.substr(0, plus))
        std::printf("  %-16s %-14s %-8s %5.2f   (CPU s/GB %.3f -> %.3f)\n", r.state.c_str(),
                    p.path.c_str(), r.op.c_str(), p.t.best / r.t.best, p.t.cpu / (p.bytes / 1e9),
                    r.t.cpu / (r.bytes / 1e9));
  }
  std::printf(
      "\nhost memory per rank with pushed backups (its own snapshot segment, which holds the "
      "live state on CPU, + the backup segment it keeps for its peer; with replica backups "
      "there is none, see keel-bench recovery):\n");
  std::printf("%-16s %10s %14s %14s %10s\n", "state", "state MB", "own seg MB", "backup seg MB",
              "ratio");
  for (const MemRow& m : mem)
    std::printf("%-16s %10.1f %14.1f %14.1f %9.2fx\n", m.state.c_str(), m.state_bytes / 1e6,
                m.own_segment / 1e6, m.backup_segment / 1e6,
                double(m.own_segment + m.backup_segment) / double(m.state_bytes));
  return 0;
}

}  // namespace

namespace bench {

Command add_restore_command(CLI::App& app) {
  auto o = std::make_shared<RestoreOptions>();
  CLI::App* sub = app.add_subcommand(
      "restore", "restoring one rank from its backup holder, and its segments' host memory");
  sub->add_option("--repeats", o->repeats, "timed repeats of each, best of them (default 5)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxRepeats));
  sub->add_option("--sizes", o->sizes,
                  "the states, comma-separated: medium (L6 d512, 230 MB), 1g (L28 d512) (default "
                  "both)")
      ->option_text("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember({"medium", "1g"}));
  sub->add_flag("--no-netns", o->no_netns,
                "loopback only; across network namespaces needs root and iproute2");
  return {sub, [o] { return restore_main(*o); }};
}

}  // namespace bench
}  // namespace keel
