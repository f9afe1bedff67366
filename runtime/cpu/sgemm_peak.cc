// Measures and caches the SGEMM peak (see sgemm_peak.h).
#include "runtime/cpu/sgemm_peak.h"

#include <cblas.h>
#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "runtime/cpu/kernels.h"

namespace keel {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t begin = line.find_first_not_of(" \t", colon + 1);
        if (begin != std::string::npos) return line.substr(begin);
      }
    }
  }
  return "unknown CPU";
}

namespace {

constexpr int kSize = 1536;

std::filesystem::path cache_dir() {
  if (const char* dir = std::getenv("KEEL_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::filesystem::path(home) / ".cache" / "keel";
  }
  return std::filesystem::temp_directory_path() / "keel-cache";
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Measurement {
  double flops_per_s;
  bool busy;  // our threads did not get the cores to themselves
};

// OpenBLAS's own threading rather than the backend's row split: the peak should be the
// machine's, not a property of keel's kernels.
Measurement measure(int threads) {
  std::vector<float> a(size_t(kSize) * kSize), b(size_t(kSize) * kSize), c(size_t(kSize) * kSize);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 97) * 0.01f;
    b[i] = float(i % 89) * 0.01f;
  }
  openblas_set_num_threads(threads);
  double best = 1e30, best_cpu = 0, total = 0;
  auto run = [&] {
    const double cpu0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kSize, kSize, kSize, 1.0f, a.data(), kSize,
                b.data(), kSize, 0.0f, c.data(), kSize);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (wall < best) {
      best = wall;
      best_cpu = process_cpu_seconds() - cpu0;
    }
    total += wall;
  };
  run();  // warm-up: starts OpenBLAS's threads and faults in the pages
  best = 1e30;
  total = 0;
  for (int rep = 0; rep < 20 && (rep < 3 || total < 1.0); ++rep) run();
  cpu::blas_single_threaded();
  // On a machine shared with other work the rate says more about the neighbours than about
  // the CPU: if even the best run's threads were off-core for a tenth of it, say so rather
  // than remember the number.
  const bool busy = best_cpu < 0.9 * best * threads;
  return {2.0 * kSize * kSize * kSize / best, busy};
}

// The cache file: the CPU model on the first line, the rate in FLOP/s on the second.
bool read_cache(const std::filesystem::path& file, const std::string& model, double* flops) {
  std::ifstream in(file);
  std::string cached_model, rate;
  if (!std::getline(in, cached_model) || !std::getline(in, rate) || cached_model != model) {
    return false;
  }
  char* end = nullptr;
  double v = std::strtod(rate.c_str(), &end);
  if (end == rate.c_str() || !(v > 0)) return false;
  *flops = v;
  return true;
}

void write_cache(const std::filesystem::path& file, const std::string& model, double flops) {
  // Write then rename, so a reader never sees half a file.
  std::filesystem::path tmp = file;
  tmp += ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out.precision(17);
    out << model << "\n" << flops << "\n";
    if (!out) return;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

PeakFlops cpu_sgemm_peak(int threads) {
  if (threads <= 0) threads = omp_get_num_procs();
  static std::mutex mu;
  std::lock_guard<std::mutex> guard(mu);

  const std::string model = cpu_model_name();
  std::ostringstream label;
  label << "measured SGEMM " << kSize << "^3, " << threads
        << (threads == 1 ? " thread, " : " threads, ") << model;

  const std::filesystem::path dir = cache_dir();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path file = dir / ("sgemm_peak_" + std::to_string(threads) + "t.txt");

  // The cache is an optimisation: if its folder is unusable, measure and say so.
  int lock_fd = ec ? -1 : ::open((file.string() + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  if (lock_fd >= 0 && ::flock(lock_fd, LOCK_EX) != 0) {
    ::close(lock_fd);
    lock_fd = -1;
  }
  PeakFlops peak;
  if (lock_fd >= 0 && read_cache(file, model, &peak.flops_per_s)) {
    peak.source = label.str() + " (cached)";
  } else {
    Measurement m = measure(threads);
    peak.flops_per_s = m.flops_per_s;
    peak.source = label.str();
    if (m.busy) {
      peak.source += " (machine busy, not cached)";
    } else if (lock_fd >= 0) {
      write_cache(file, model, peak.flops_per_s);
    }
  }
  if (lock_fd >= 0) ::close(lock_fd);  // also releases the lock
  return peak;
}

}  // namespace keel
