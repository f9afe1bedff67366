// CPUID and XGETBV decoding (see cpu_features.h). Bit positions are from the Intel SDM,
// vol. 2A, CPUID leaves 1 and 7; AMD uses the same bits for these features.
#include "runtime/cpu/cpu_features.h"

#include <cpuid.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

namespace keel {

namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

bool bit(unsigned v, int i) {
  return (v >> i) & 1u;
}

// XCR0: which register states the OS saves on a context switch. A CPU feature whose state
// the OS does not save faults (#UD) when used, so it does not count.
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

std::string trim(std::string s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::string brand_string() {
  if (cpuid(0x80000000).a < 0x80000004) return "";
  char brand[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    Regs r = cpuid(0x80000002 + i);
    std::memcpy(brand + 16 * i, &r.a, 4);
    std::memcpy(brand + 16 * i + 4, &r.b, 4);
    std::memcpy(brand + 16 * i + 8, &r.c, 4);
    std::memcpy(brand + 16 * i + 12, &r.d, 4);
  }
  return trim(brand);
}

// Physical cores from /proc/cpuinfo's (physical id, core id) pairs; the online CPU count
// when it does not say.
int physical_cores() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, phys;
  std::set<std::pair<std::string, std::string>> cores;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "physical id") phys = value;
    if (key == "core id") cores.insert({phys, value});
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (!cores.empty()) return int(cores.size());
  return online > 0 ? int(online) : 1;
}

// The clock the core runs at now, from a chain of dependent adds (one cycle each on every
// x86 core since the Pentium 4): a VM's /proc/cpuinfo shows the nominal clock, often far
// below the boost clock its cores really run at (2.6 against ~3.6 GHz on the Zen 5 VM).
double measured_clock_hz() {
  constexpr long kIters = 4'000'000;  // of 8 adds: ~10 ms at 3 GHz
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    uint64_t x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kIters; ++i)
      asm volatile(
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
          : "+r"(x));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 8.0 * double(kIters) / s);
  }
  return best;
}

CpuClock read_clock() {
  CpuClock clk;
  std::ifstream max("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  if (max >> khz && khz > 0) {
    clk.hz = khz * 1e3;
    clk.source = "cpufreq max";
    return clk;
  }
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const size_t colon = line.find(':');
    const double mhz = colon == std::string::npos ? 0 : std::atof(line.c_str() + colon + 1);
    if (mhz > 0) {
      clk.hz = mhz * 1e6;
      clk.source = "/proc/cpuinfo cpu MHz";
    }
    break;
  }
  // No cpufreq (a VM): the clock measured, where it is above the nominal one.
  const double measured = measured_clock_hz();
  if (measured > clk.hz) {
    clk.hz = measured;
    clk.source = "measured, dependent adds";
  }
  return clk;
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;

  const Regs l1 = cpuid(1);
  const unsigned base_family = (l1.a >> 8) & 0xf, base_model = (l1.a >> 4) & 0xf;
  f.family = int(base_family == 0xf ? base_family + ((l1.a >> 20) & 0xff) : base_family);
  f.model = int(base_family == 0x6 || base_family == 0xf ? base_model + (((l1.a >> 16) & 0xf) << 4)
                                                         : base_model);
  f.model_name = brand_string();
  if (f.model_name.empty()) f.model_name = "unknown CPU";

  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool os_avx = (xcr & 0x6) == 0x6;                 // SSE and AVX state
  const bool os_avx512 = os_avx && (xcr & 0xe0) == 0xe0;  // opmask, ZMM0-15 upper, ZMM16-31
  const bool os_amx = (xcr & 0x60000) == 0x60000;         // XTILECFG, XTILEDATA

  const Regs l7 = v.a >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l71 = v.a >= 7 && l7.a >= 1 ? cpuid(7, 1) : Regs{};
  f.avx = os_avx && bit(l1.c, 28);
  f.fma = f.avx && bit(l1.c, 12);
  f.avx2 = os_avx && bit(l7.b, 5);
  f.avx512f = os_avx512 && bit(l7.b, 16);
  f.avx512dq = os_avx512 && bit(l7.b, 17);
  f.avx512bw = os_avx512 && bit(l7.b, 30);
  f.avx512vl = os_avx512 && bit(l7.b, 31);
  f.avx512_bf16 = f.avx512f && bit(l71.a, 5);
  // Linux also wants arch_prctl(ARCH_REQ_XCOMP_PERM) before a process touches AMX tiles;
  // XCR0 says whether the kernel supports them at all, which is what a kernel choice needs.
  f.amx_tile = os_amx && bit(l7.d, 24);
  f.amx_bf16 = f.amx_tile && bit(l7.d, 22);

  f.cores = physical_cores();
  return f;
}

}  // namespace

std::string CpuFeatures::describe() const {
  return model_name + " (" + vendor + " family " + std::to_string(family) + " model " +
         std::to_string(model) + ")";
}

std::string CpuFeatures::isa() const {
  std::string s;
  if (avx512()) {
    s = "AVX-512 (F/BW/VL/DQ)";
    if (avx512_bf16) s += " +BF16";
  } else if (avx512f) {
    s = "AVX-512F";
  } else if (avx2 && fma) {
    s = "AVX2+FMA";
  } else if (avx) {
    s = avx2 ? "AVX2" : "AVX";
  } else {
    s = "SSE";
  }
  if (amx_tile) s += amx_bf16 ? " +AMX-BF16" : " +AMX";
  return s;
}

int CpuFeatures::fp32_flops_per_cycle() const {
  // Zen 4 (AMD family 0x19) executes 512-bit operations on 256-bit units.
  if (avx512f && fma) return vendor == "AuthenticAMD" && family < 0x1a ? 32 : 64;
  if (fma) return 32;
  // AVX without FMA: one 8-wide add and one 8-wide multiply per cycle; SSE half that.
  return avx ? 16 : 8;
}

double CpuFeatures::theoretical_peak_flops(int threads) const {
  const int n = threads > 0 ? std::min(threads, cores) : cores;
  return double(n) * cpu_clock().hz * fp32_flops_per_cycle();
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const CpuClock& cpu_clock() {
  static const CpuClock c = read_clock();
  return c;
}

}  // namespace keel
