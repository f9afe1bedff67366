#include "launcher/run_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <google/protobuf/util/json_util.h>

#include "proto/json_gaps.h"
#include "runtime/check.h"

namespace keel {
namespace {

// Enough digits that a float survives the round trip, so tests can compare exactly.
std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// Writes `path` whole or not at all: through path.tmp, renamed over it once every byte is
// out. A failure (a full disk at the end of a run) removes path.tmp and throws keel::Error
// naming the file and the call that failed, e.g. "r.json: write: No space left on device".
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const char* call) {
    const int err = errno;
    ::unlink(tmp.c_str());  // may not exist (open failed): nothing to check
    throw Error(path + ": " + call + ": " + std::strerror(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd == -1) fail("open");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n == -1 && errno == EINTR) continue;
    if (n == -1) {
      const int err = errno;
      ::close(fd);
      errno = err;
      fail("write");
    }
    done += size_t(n);
  }
  if (::close(fd) == -1) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) == -1) fail("rename");
}

}  // namespace

void write_report_json(const std::string& path, const RunReport& r) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(r, &json, opts);
  KEEL_CHECK(status.ok(), "report to JSON: ", status.ToString());
  write_file(path, nan_as_null(json));
}

void write_loss_svg(const std::string& path, const RunReport& r) {
  const double W = 720, H = 360, L = 70, R = 20, T = 30, B = 40;
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='" << L << "' y='18'>keel: training loss (" << r.layout() << ", " << r.losses_size()
    << " steps, final " << num(r.final_loss());
  if (r.incidents_size() > 0)
    o << ", " << r.incidents_size() << " incident(s) survived, ETTR " << num(r.ettr()).substr(0, 5);
  if (r.checkpoint_write_failures() > 0)
    o << ", " << r.checkpoint_write_failures() << " persistent checkpoint write(s) FAILED";
  o << ")</text>\n";
  if (r.losses_size() > 0) {
    // Steps without record (NaN) are gaps: out of the scale, a break in each curve.
    double lo = INFINITY, hi = -INFINITY;
    for (double v : r.losses())
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    for (double v : r.val_losses()) lo = std::min(lo, v), hi = std::max(hi, v);
    if (!(lo <= hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-9) hi = lo + 1;
    const double n = std::max<double>(1, double(r.losses_size() - 1));
    auto x = [&](double i) { return L + (W - L - R) * i / n; };
    auto y = [&](double v) { return T + (H - T - B) * (hi - v) / (hi - lo); };
    o << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B
      << "' stroke='black'/>\n<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='"
      << H - B << "' stroke='black'/>\n";
    for (int k = 0; k <= 4; ++k) {
      double v = lo + (hi - lo) * k / 4;
      o << "<text x='" << L - 6 << "' y='" << y(v) + 4 << "' text-anchor='end'>"
        << num(v).substr(0, 5) << "</text>\n";
      o << "<text x='" << x(n * k / 4) << "' y='" << H - B + 16 << "' text-anchor='middle'>"
        << int(n * k / 4) + 1 + r.first_step() << "</text>\n";
    }
    o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 6
      << "' text-anchor='middle'>step</text>\n";
    // The raw losses, light, and an exponential moving average over ~10 steps on top: the
    // per-step loss of a small batch is noisy and the trend is what a reader looks for.
    auto polyline = [&](const std::vector<double>& v, const char* colour, double width) {
      size_t i = 0;
      while (i < v.size()) {
        if (!std::isfinite(v[i])) {
          ++i;
          continue;
        }
        o << "<polyline fill='none' stroke='" << colour << "' stroke-width='" << width
          << "' points='";
        for (; i < v.size() && std::isfinite(v[i]); ++i) o << x(double(i)) << "," << y(v[i]) << " ";
        o << "'/>\n";
      }
    };
    std::vector<double> losses(r.losses().begin(), r.losses().end());
    // The average starts again after a gap: it never carries a value across steps not measured.
    std::vector<double> ema(losses.size());
    for (size_t i = 0; i < losses.size(); ++i)
      ema[i] = i == 0 || std::isnan(ema[i - 1]) ? losses[i] : 0.9 * ema[i - 1] + 0.1 * losses[i];
    polyline(losses, "#aec7e8", 1);
    polyline(ema, "#1f3f8f", 2);
    // Incidents as red rules at the step they hit, labelled with their kind.
    for (const auto& inc : r.incidents()) {
      const double i = double(inc.step() - r.first_step());
      if (i < 0 || i > n) continue;
      o << "<line x1='" << x(i) << "' y1='" << T << "' x2='" << x(i) << "' y2='" << H - B
        << "' stroke='#d62728' stroke-dasharray='4 3'/>\n<text x='" << x(i) + 3 << "' y='" << T + 12
        << "' fill='#d62728' font-size='10'>" << inc.kind() << "</text>\n";
    }
    for (int i = 0; i < r.val_losses_size(); ++i)
      o << "<circle cx='" << x(r.val_steps(i) - 1 - r.first_step()) << "' cy='"
        << y(r.val_losses(i)) << "' r='4' fill='#ff7f0e'/>\n";
    o << "<text x='14' y='" << (T + H - B) / 2 << "' transform='rotate(-90 14 " << (T + H - B) / 2
      << ")' text-anchor='middle'>loss (per step, moving average"
      << (r.val_losses_size() == 0 ? "" : ", validation: dots") << ")</text>\n";
  }
  o << "</svg>\n";
  write_file(path, o.str());
}

void ParamDigest::add(const std::string& name, const std::vector<float>& values) {
  auto mix = [&](const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ull;
  };
  mix(name.data(), name.size());
  mix(values.data(), values.size() * sizeof(float));
}

std::string ParamDigest::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

}  // namespace keel
