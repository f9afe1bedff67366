// Measures and caches the SGEMM peak (see sgemm_peak.h).
#include "runtime/cpu/sgemm_peak.h"

#include <cblas.h>
#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "runtime/cpu/blas_core.h"
#include "runtime/cpu/cpu_features.h"
#include "runtime/cpu/kernels.h"

namespace keel {

namespace {

// numpy's reference shape (peers/sgemm_peak.py): an MFU against this peak is comparable with
// one against numpy's, and 2048³ is large enough that packing costs are a few percent.
constexpr int kSize = 2048;

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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kSize, kSize, kSize, 1.0f, a.data(),
                kSize, b.data(), kSize, 0.0f, c.data(), kSize);
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

// The cache file: the key on the first line, the rate in FLOP/s on the second.
bool read_cache(const std::filesystem::path& file, const std::string& key, double* flops) {
  std::ifstream in(file);
  std::string cached_key, rate;
  if (!std::getline(in, cached_key) || !std::getline(in, rate) || cached_key != key) {
    return false;
  }
  char* end = nullptr;
  double v = std::strtod(rate.c_str(), &end);
  if (end == rate.c_str() || !(v > 0)) return false;
  *flops = v;
  return true;
}

void write_cache(const std::filesystem::path& file, const std::string& key, double flops) {
  // Write then rename, so a reader never sees half a file.
  std::filesystem::path tmp = file;
  tmp += ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out.precision(17);
    out << key << "\n" << flops << "\n";
    if (!out) return;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

std::string sgemm_peak_cache_key(const std::string& cpu_model, const std::string& isa,
                                 const std::string& blas_config, const std::string& blas_core,
                                 int threads) {
  std::ostringstream key;
  key << cpu_model << " | " << isa << " | " << blas_config << " | " << blas_core << " | " << threads
      << (threads == 1 ? " thread" : " threads");
  return key.str();
}

std::string sgemm_peak_cache_name(const std::string& key, int threads) {
  // FNV-1a: a short, stable name; the key itself is checked on read, so a collision only
  // costs a measurement.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return "sgemm_peak_" + std::to_string(threads) + "t_" + hex + ".txt";
}

std::string sgemm_peak_cache_key(int threads) {
  const BlasPath blas = blas_path();
  return sgemm_peak_cache_key(cpu_features().model_name, cpu_features().isa(), blas.config,
                              blas.core, threads);
}

void forget_sgemm_peak(const PeakFlops& peak) {
  if (peak.cache_file.empty()) return;
  std::error_code ec;
  std::filesystem::remove(peak.cache_file, ec);
}

PeakFlops cpu_sgemm_peak(int threads) {
  if (threads <= 0) threads = omp_get_num_procs();
  static std::mutex mu;
  std::lock_guard<std::mutex> guard(mu);

  const CpuFeatures& cpu = cpu_features();
  const std::string core = blas_path().core;
  const std::string key = sgemm_peak_cache_key(threads);
  std::ostringstream label;
  label << "measured SGEMM " << kSize << "^3, " << threads
        << (threads == 1 ? " thread, " : " threads, ") << "OpenBLAS " << core << ", "
        << cpu.model_name;

  PeakFlops peak;
  peak.theoretical_flops_per_s = cpu.theoretical_peak_flops(threads);
  if (peak.theoretical_flops_per_s > 0) {
    const int cores = std::min(threads, cpu.cores);
    std::ostringstream t;
    t.precision(3);
    t << "estimate: " << cores << (cores == 1 ? " core x " : " cores x ") << cpu_clock().hz / 1e9
      << " GHz (" << cpu_clock().source << ") x " << cpu.fp32_flops_per_cycle() << " FLOP/cycle ("
      << cpu.isa() << ")";
    peak.theoretical_source = t.str();
  } else {
    peak.theoretical_source = "unknown clock";
  }

  const std::filesystem::path dir = cache_dir();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path file = dir / sgemm_peak_cache_name(key, threads);

  // The cache is an optimisation: if its folder is unusable, measure and say so.
  int lock_fd = ec ? -1 : ::open((file.string() + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  if (lock_fd >= 0 && ::flock(lock_fd, LOCK_EX) != 0) {
    ::close(lock_fd);
    lock_fd = -1;
  }
  if (lock_fd >= 0 && read_cache(file, key, &peak.flops_per_s)) {
    peak.source = label.str() + " (cached)";
    peak.cache_file = file.string();
  } else {
    Measurement m = measure(threads);
    peak.flops_per_s = m.flops_per_s;
    peak.source = label.str();
    if (m.busy) {
      peak.source += " (machine busy, not cached)";
    } else if (lock_fd >= 0) {
      write_cache(file, key, peak.flops_per_s);
      peak.cache_file = file.string();
    }
  }
  if (lock_fd >= 0) ::close(lock_fd);  // also releases the lock
  return peak;
}

}  // namespace keel
