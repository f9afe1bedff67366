// Measures and caches the SGEMM peak (see sgemm_peak.h).
#include "runtime/cpu/sgemm_peak.h"

#include <cblas.h>
#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
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

namespace {

constexpr int kSize = 1536;

std::string cpu_model() {
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

std::filesystem::path cache_dir() {
  if (const char* dir = std::getenv("KEEL_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::filesystem::path(home) / ".cache" / "keel";
  }
  return std::filesystem::temp_directory_path() / "keel-cache";
}

// OpenBLAS's own threading rather than the backend's row split: the peak should be the
// machine's, not a property of keel's kernels.
double measure(int threads) {
  std::vector<float> a(size_t(kSize) * kSize), b(size_t(kSize) * kSize), c(size_t(kSize) * kSize);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 97) * 0.01f;
    b[i] = float(i % 89) * 0.01f;
  }
  openblas_set_num_threads(threads);
  auto run = [&] {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kSize, kSize, kSize, 1.0f, a.data(), kSize,
                b.data(), kSize, 0.0f, c.data(), kSize);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  run();  // warm-up: starts OpenBLAS's threads and faults in the pages
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 20 && (rep < 3 || total < 1.0); ++rep) {
    double t = run();
    total += t;
    best = std::min(best, t);
  }
  cpu::blas_single_threaded();
  return 2.0 * kSize * kSize * kSize / best;
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

  const std::string model = cpu_model();
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
    peak.flops_per_s = measure(threads);
    peak.source = label.str();
    if (lock_fd >= 0) write_cache(file, model, peak.flops_per_s);
  }
  if (lock_fd >= 0) ::close(lock_fd);  // also releases the lock
  return peak;
}

}  // namespace keel
