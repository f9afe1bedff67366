#include "bench/soak_svg.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace keel::bench {

std::string soak_rss_svg(const ProcessWatch& watch, double wall_s) {
  const double W = 900, H = 420, L = 70, R = 200, T = 40, B = 50;
  std::vector<const ProcessWatch::Process*> shown;
  double top = 1;
  for (const auto& [key, p] : watch.seen()) {
    if (p.samples.size() < 2) continue;
    if (p.samples.back().t - p.samples.front().t < 0.5 * wall_s) continue;  // short-lived
    shown.push_back(&p);
    for (const auto& s : p.samples) top = std::max(top, s.rss / 1048576.0);
  }
  top *= 1.1;
  const double span = std::max(1.0, wall_s);
  auto x = [&](double t) { return L + (W - L - R) * t / span; };
  auto y = [&](double mib) { return H - B - (H - T - B) * mib / top; };
  std::string svg;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
      "font-family='sans-serif' font-size='12'>\n<rect width='100%%' height='100%%' "
      "fill='white'/>\n<text x='%.0f' y='22' font-size='15'>Anonymous resident memory of the "
      "job's long-lived processes during the soak (MiB)</text>\n",
      W, H, L);
  svg += buf;
  for (int i = 0; i <= 4; ++i) {
    const double v = top * i / 4;
    std::snprintf(buf, sizeof buf,
                  "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' stroke='#ddd'/>"
                  "<text x='%.1f' y='%.1f' text-anchor='end'>%.0f</text>\n",
                  L, W - R, y(v), y(v), L - 6, y(v) + 4, v);
    svg += buf;
    const double t = span * i / 4;
    std::snprintf(buf, sizeof buf, "<text x='%.1f' y='%.1f' text-anchor='middle'>%.0f s</text>\n",
                  x(t), H - B + 18, t);
    svg += buf;
  }
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                  "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  int k = 0;
  for (const ProcessWatch::Process* p : shown) {
    const char* c = colours[k % 10];
    svg += std::string("<polyline fill='none' stroke-width='1.5' stroke='") + c + "' points='";
    for (const auto& s : p->samples) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x(s.t), y(s.rss / 1048576.0));
      svg += buf;
    }
    svg += "'/>\n";
    std::snprintf(buf, sizeof buf,
                  "<rect x='%.1f' y='%.1f' width='12' height='3' fill='%s'/><text x='%.1f' "
                  "y='%.1f'>%s %d</text>\n",
                  W - R + 12, T + 14.0 * k + 4, c, W - R + 28, T + 14.0 * k + 9, p->name.c_str(),
                  p->pid);
    svg += buf;
    ++k;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace keel::bench
