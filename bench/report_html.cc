#include "bench/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "proto/faults.pb.h"

namespace keel::bench {
namespace {

constexpr const char* kRunColours[] = {"#444444", "#1f77b4", "#d62728",
                                       "#2ca02c", "#9467bd", "#ff7f0e"};
// injected→detected, →evicted, →rebuilt, →restored, →first step.
constexpr const char* kPhaseNames[] = {"detection", "eviction", "rebuild", "restore", "first step"};
constexpr const char* kPhaseColours[] = {"#e45756", "#f58518", "#eeca3b", "#54a24b", "#4c78a8"};

constexpr double kW = 860, kH = 260, kLeft = 60, kRight = 20, kTop = 20, kBottom = 40;

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += (static_cast<unsigned char>(c) < 0x20 && c != '\n') ? ' ' : c;
    }
  }
  return o;
}

std::string num(double v, int prec = 3) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.*g", prec, v);
  return b;
}

std::string fixed(double v, int decimals) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.*f", decimals, v);
  return b;
}

// Round tick values (1, 2 or 5 × 10^k apart), about five of them, within [lo, hi].
std::vector<double> nice_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

const char* colour(int run) {
  return kRunColours[run % 6];
}

// A chart's axes: data ranges mapped onto the plot area.
struct Axes {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  double px(double x) const { return kLeft + (x - x0) / (x1 - x0) * (kW - kLeft - kRight); }
  double py(double y) const { return kH - kBottom - (y - y0) / (y1 - y0) * (kH - kTop - kBottom); }
};

// An <svg> of `height` whose id the render test (tests/bench/report_render_test.py) finds.
std::string svg_open(const std::string& id, const std::string& title, double height) {
  return "<svg id=\"" + id + "\" width=\"" + num(kW, 6) + "\" height=\"" + fixed(height, 0) +
         "\" role=\"img\"><title>" + esc(title) + "</title>\n";
}

std::string text(double x, double y, const std::string& s, const std::string& extra = "") {
  return "<text x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y, 1) + "\"" + extra + ">" + esc(s) +
         "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& style) {
  return "<line x1=\"" + fixed(x1, 1) + "\" y1=\"" + fixed(y1, 1) + "\" x2=\"" + fixed(x2, 1) +
         "\" y2=\"" + fixed(y2, 1) + "\" " + style + "/>\n";
}

// Axes, ticks and labels of a chart.
std::string frame(const Axes& a, const std::string& xlabel, const std::string& ylabel) {
  std::string s;
  s += line(kLeft, kH - kBottom, kW - kRight, kH - kBottom, "stroke=\"#000\"");
  s += line(kLeft, kTop, kLeft, kH - kBottom, "stroke=\"#000\"");
  for (double x : nice_ticks(a.x0, a.x1)) {
    s += line(a.px(x), kH - kBottom, a.px(x), kH - kBottom + 4, "stroke=\"#000\"");
    s += text(a.px(x), kH - kBottom + 16, num(x), " text-anchor=\"middle\"");
  }
  for (double y : nice_ticks(a.y0, a.y1)) {
    s += line(kLeft - 4, a.py(y), kW - kRight, a.py(y), "stroke=\"#ddd\"");
    s += text(kLeft - 6, a.py(y) + 4, num(y), " text-anchor=\"end\"");
  }
  s += text((kLeft + kW - kRight) / 2, kH - 6, xlabel, " text-anchor=\"middle\"");
  s += text(12, kTop + (kH - kTop - kBottom) / 2, ylabel,
            " text-anchor=\"middle\" transform=\"rotate(-90 12 " +
                fixed(kTop + (kH - kTop - kBottom) / 2, 1) + ")\"");
  return s;
}

std::string legend(const BenchReport& rep) {
  std::string s = "<p class=\"legend\">";
  for (int i = 0; i < rep.runs_size(); ++i)
    s += "<span style=\"color:" + std::string(colour(i)) + "\">&#9632; " + esc(rep.runs(i).name()) +
         "</span> ";
  return s + "<span class=\"mark\">&#9474; incident (detected)</span></p>\n";
}

// A curve per run of `y(run)` against the run's step end times, incidents as dashed lines.
// `steps`: each value holds from the previous step's end to its own (a rate of that step),
// so a recovery shows as a flat dip over its whole length; else a point per step's end.
template <class Series>
std::string time_chart(const BenchReport& rep, const std::string& id, const std::string& title,
                       const std::string& ylabel, bool steps, Series y) {
  Axes a;
  a.x1 = 1e-9;
  double lo = INFINITY, hi = -INFINITY;
  for (const BenchRun& r : rep.runs()) {
    a.x1 = std::max(a.x1, r.wall_s());
    const auto& v = y(r);
    for (int i = 0; i < int(v.size()) && i < r.step_end_s_size(); ++i) {
      if (!std::isfinite(v[i]) || !std::isfinite(r.step_end_s(i))) continue;
      lo = std::min(lo, v[i]);
      hi = std::max(hi, v[i]);
      a.x1 = std::max(a.x1, r.step_end_s(i));
    }
  }
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) hi = lo + 1;
  // Rates from zero, loss from a little below its lowest (so no curve runs along the axis).
  a.y0 = steps ? std::min(0.0, lo) : lo - (hi - lo) * 0.05;
  a.y1 = hi + (hi - a.y0) * 0.2;  // a band above the curves for the incident labels
  std::string s = svg_open(id, title, kH) + frame(a, "seconds since the job's start", ylabel);
  for (int k = 0; k < rep.runs_size(); ++k) {
    const BenchRun& r = rep.runs(k);
    for (const keel::report::Incident& inc : r.incidents()) {
      if (inc.detected_at() <= 0 || r.started_at() <= 0) continue;
      const double x = a.px(std::clamp(inc.detected_at() - r.started_at(), a.x0, a.x1));
      s += line(x, kTop, x, kH - kBottom,
                "class=\"incident-mark\" stroke=\"" + std::string(colour(k)) +
                    "\" stroke-dasharray=\"4 3\"");
      // Runs hit by the same fault mark it at about the same time: their labels stack.
      s += text(x + 2, kTop + 9 + 10 * ((k + 5) % 6), inc.kind(),
                " font-size=\"9\" fill=\"" + std::string(colour(k)) + "\"");
    }
    const auto& v = y(r);
    // A value not measured (a step without record) is a gap: the curve breaks there, one
    // polyline per stretch of known values, never a line drawn across it.
    std::string pts;
    auto point = [&](double x, double v) {
      pts += fixed(a.px(x), 1) + "," + fixed(a.py(v), 1) + " ";
    };
    auto end_stretch = [&] {
      if (!pts.empty())
        s += "<polyline class=\"run-curve\" data-run=\"" + esc(r.name()) +
             "\" fill=\"none\" stroke-width=\"1.5\" stroke=\"" + std::string(colour(k)) +
             "\" points=\"" + pts + "\"/>\n";
      pts.clear();
    };
    for (int i = 0; i < int(v.size()) && i < r.step_end_s_size(); ++i) {
      if (!std::isfinite(v[i]) || !std::isfinite(r.step_end_s(i))) {
        end_stretch();
        continue;
      }
      if (steps && i > 0 && std::isfinite(r.step_end_s(i - 1))) point(r.step_end_s(i - 1), v[i]);
      point(r.step_end_s(i), v[i]);
    }
    end_stretch();
  }
  return s + "</svg>\n";
}

// The phase boundaries of an incident (unix seconds; 0: not recorded), first to last.
std::vector<double> phases(const keel::report::Incident& inc) {
  const double restored = inc.restored_at() > 0 ? inc.restored_at() : inc.recovered_at();
  return {inc.injected_at() > 0 ? inc.injected_at() : inc.detected_at(),
          inc.detected_at(),
          inc.evicted_at(),
          inc.rebuilt_at(),
          restored,
          inc.first_step_at()};
}

std::string timeline(const BenchReport& rep) {
  struct Row {
    int run;
    const keel::report::Incident* inc;
  };
  std::vector<Row> rows;
  double longest = 1e-3;
  for (int k = 0; k < rep.runs_size(); ++k)
    for (const keel::report::Incident& inc : rep.runs(k).incidents()) {
      const std::vector<double> p = phases(inc);
      if (p[0] <= 0) continue;
      rows.push_back({k, &inc});
      for (double t : p)
        if (t > 0) longest = std::max(longest, t - p[0]);
    }
  const double row_h = 18, label_w = 230, w = kW, right = 20;
  const double h = kTop + row_h * double(std::max<size_t>(rows.size(), 1)) + 60;
  std::string s = svg_open("incident-timeline", "Incident timeline", h);
  auto px = [&](double t) { return label_w + t / longest * (w - label_w - right); };
  if (rows.empty()) s += text(label_w, kTop + 12, "no incidents");
  for (size_t i = 0; i < rows.size(); ++i) {
    const BenchRun& r = rep.runs(rows[i].run);
    const keel::report::Incident& inc = *rows[i].inc;
    const double y = kTop + row_h * double(i);
    s += "<g class=\"incident-row\" data-run=\"" + esc(r.name()) + "\">\n";
    s += text(4, y + 12,
              r.name() + ": " + inc.kind() + " step " + std::to_string(inc.step()) + " rank " +
                  std::to_string(inc.rank()),
              " font-size=\"11\" fill=\"" + std::string(colour(rows[i].run)) + "\"");
    const std::vector<double> p = phases(inc);
    double from = p[0];
    for (size_t ph = 1; ph < p.size(); ++ph) {
      if (p[ph] <= 0 || p[ph] < from) continue;
      s += "<rect class=\"phase\" x=\"" + fixed(px(from - p[0]), 1) + "\" y=\"" + fixed(y + 2, 1) +
           "\" width=\"" + fixed(std::max(1.0, px(p[ph] - p[0]) - px(from - p[0])), 1) +
           "\" height=\"" + fixed(row_h - 4, 1) + "\" fill=\"" + kPhaseColours[ph - 1] +
           "\"><title>" + kPhaseNames[ph - 1] + ": " + fixed(p[ph] - from, 3) +
           " s</title></rect>\n";
      from = p[ph];
    }
    s += "</g>\n";
  }
  const double axis_y = kTop + row_h * double(std::max<size_t>(rows.size(), 1)) + 4;
  s += line(label_w, axis_y, w - right, axis_y, "stroke=\"#000\"");
  for (double t : nice_ticks(0, longest)) {
    s += line(px(t), axis_y, px(t), axis_y + 4, "stroke=\"#000\"");
    s += text(px(t), axis_y + 16, num(t), " text-anchor=\"middle\"");
  }
  s += text(label_w, axis_y + 30, "seconds since the fault was injected");
  double lx = label_w + 240;
  for (int ph = 0; ph < 5; ++ph) {
    s += "<rect x=\"" + fixed(lx, 1) + "\" y=\"" + fixed(axis_y + 20, 1) +
         "\" width=\"10\" height=\"10\" fill=\"" + kPhaseColours[ph] + "\"/>\n";
    s += text(lx + 13, axis_y + 30, kPhaseNames[ph], " font-size=\"11\"");
    lx += 80;
  }
  return s + "</svg>\n";
}

// A bar per policy run; the fault-free run (runs[0]), whose ETTR is what start-up alone costs,
// as a dashed reference line across them.
std::string ettr_bars(const BenchReport& rep) {
  const int n = std::max(rep.runs_size() - 1, 0);
  const double bar_h = 24, label_w = 120, h = kTop + bar_h * std::max(n, 1) + 56;
  std::string s = svg_open("ettr-bars", "ETTR per policy", h);
  auto px = [&](double v) { return label_w + std::clamp(v, 0.0, 1.0) * (kW - label_w - 80); };
  if (n == 0) s += text(label_w, kTop + 16, "no policy runs");
  for (int k = 1; k < rep.runs_size(); ++k) {
    const BenchRun& r = rep.runs(k);
    const double y = kTop + bar_h * (k - 1);
    s += text(4, y + 16, r.name());
    s += "<rect class=\"ettr-bar\" data-run=\"" + esc(r.name()) + "\" x=\"" + fixed(label_w, 1) +
         "\" y=\"" + fixed(y + 3, 1) + "\" width=\"" +
         fixed(std::max(0.0, px(r.ettr()) - label_w), 1) + "\" height=\"" + fixed(bar_h - 6, 1) +
         "\" fill=\"" + colour(k) + "\"/>\n";
    // The values in a column right of 100%, where neither bars nor the reference reach.
    s += text(px(1) + 8, y + 16, fixed(100 * r.ettr(), 1) + "%");
  }
  const double axis_y = kTop + bar_h * std::max(n, 1) + 4;
  if (rep.runs_size() > 0) {
    const double x = px(rep.runs(0).ettr());
    s += line(x, kTop - 4, x, axis_y,
              "class=\"ettr-reference\" stroke=\"#444\" stroke-dasharray=\"5 3\"");
    s += line(label_w, axis_y + 30, label_w + 16, axis_y + 30,
              "stroke=\"#444\" stroke-dasharray=\"5 3\"");
    s += text(label_w + 22, axis_y + 34,
              rep.runs(0).name() + ": " + fixed(100 * rep.runs(0).ettr(), 1) +
                  "% (what start-up and shutdown alone cost)",
              " fill=\"#444\"");
  }
  s += line(label_w, axis_y, px(1), axis_y, "stroke=\"#000\"");
  for (int i = 0; i <= 4; ++i)
    s += text(px(i / 4.0), axis_y + 14, std::to_string(25 * i) + "%", " text-anchor=\"middle\"");
  return s + "</svg>\n";
}

std::string runs_table(const BenchReport& rep) {
  std::string s =
      "<table id=\"runs\"><tr><th>run</th><th>ok</th><th>tokens/s</th><th>MFU</th><th>ETTR</th>"
      "<th>wall s</th><th>productive s</th><th>detection</th><th>eviction</th><th>rebuild</th>"
      "<th>restore</th><th>first step</th><th>lost steps</th><th>other</th><th>restarts</th>"
      "<th>bitwise equal</th></tr>\n";
  for (const BenchRun& r : rep.runs()) {
    const LostTime& l = r.lost();
    s += "<tr class=\"run\"><td>" + esc(r.name()) + "</td><td>" + (r.ok() ? "yes" : "NO") +
         "</td><td>" + fixed(r.tokens_per_s(), 0) + "</td><td>" + fixed(100 * r.mfu(), 2) +
         "%</td><td>" + fixed(100 * r.ettr(), 1) + "%</td><td>" + fixed(r.wall_s(), 2) +
         "</td><td>" + fixed(r.productive_s(), 2) + "</td>";
    for (double v : {l.detection(), l.eviction(), l.rebuild(), l.restore(), l.first_step(),
                     l.lost_steps(), l.other()})
      s += "<td>" + fixed(v, 3) + "</td>";
    s += "<td>" + std::to_string(l.restarts()) + "</td><td>" + (r.bitwise_equal() ? "yes" : "NO") +
         "</td></tr>\n";
  }
  return s + "</table>\n";
}

std::string incident_table(const BenchReport& rep) {
  std::string s =
      "<table id=\"incidents\"><tr><th>run</th><th>kind</th><th>step</th><th>rank</th><th>rule</th>"
      "<th>action</th><th>detection s</th><th>to first step s</th><th>steps lost</th>"
      "<th>restored from</th></tr>\n";
  for (const BenchRun& r : rep.runs())
    for (const keel::report::Incident& inc : r.incidents()) {
      const std::vector<double> p = phases(inc);
      auto d = [](double a, double b) {
        return a > 0 && b > 0 ? fixed(b - a, 3) : std::string("-");
      };
      s += "<tr class=\"incident\"><td>" + esc(r.name()) + "</td><td>" + esc(inc.kind()) +
           "</td><td>" + std::to_string(inc.step()) + "</td><td>" + std::to_string(inc.rank()) +
           "</td><td>" + esc(inc.rule()) + "</td><td>" + esc(inc.action()) + "</td><td>" +
           d(inc.injected_at(), inc.detected_at()) + "</td><td>" + d(p[0], p[5]) + "</td><td>" +
           std::to_string(inc.steps_lost()) + "</td><td>" + esc(inc.restored_from()) +
           "</td></tr>\n";
    }
  return s + "</table>\n";
}

}  // namespace

std::string report_html(const BenchReport& rep) {
  std::string s =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n"
      "<meta charset=\"utf-8\"/>\n<title>keel-bench report</title>\n<style>\n"
      "body{font-family:sans-serif;margin:20px;color:#222}"
      "table{border-collapse:collapse;font-size:12px;margin:8px 0}"
      "td,th{border:1px solid #bbb;padding:3px 6px;text-align:right}"
      "th{background:#eee}td:first-child{text-align:left}"
      "svg{display:block;margin:6px 0;font-size:11px;font-family:sans-serif}"
      ".legend "
      "span{margin-right:14px}.mark,.note{color:#666}.note{font-size:12px}pre{background:#f6f6f6;"
      "padding:6px}\n"
      "</style>\n</head>\n<body>\n<h1>keel-bench</h1>\n";
  s += "<p>Config <code>" + esc(rep.config()) + "</code>, " + std::to_string(rep.steps()) +
       " steps, fault-free step " + fixed(rep.step_time_s() * 1000, 1) +
       " ms; keel-launch --local " + std::to_string(rep.local()) + " --standby " +
       std::to_string(rep.standby()) + " --workers-per-slot " +
       std::to_string(rep.workers_per_slot()) + ".</p>\n";
  std::string faults;
  for (const keel::faults::Fault& f : rep.schedule().fault())
    faults += keel::faults::Fault::Kind_Name(f.kind()) + " at step " + std::to_string(f.step()) +
              " rank " + std::to_string(f.rank()) + "\n";
  for (const keel::faults::Fault& f : rep.left_out())
    faults += "(left out: " + keel::faults::Fault::Kind_Name(f.kind()) + " at step " +
              std::to_string(f.step()) + ", beyond the job's last step)\n";
  s += "<h2>Fault schedule</h2>\n<pre>" + esc(faults.empty() ? "none\n" : faults) + "</pre>\n";
  s += "<h2>Runs</h2>\n<p class=\"note\">Detection to other: the time not spent in kept steps, "
       "by cause, in seconds.</p>\n" +
       runs_table(rep);
  s += "<h2>ETTR per policy</h2>\n" + ettr_bars(rep);
  s += "<h2>Loss over time</h2>\n" + legend(rep) +
       time_chart(rep, "loss-chart", "Loss over time", "loss", false,
                  [](const BenchRun& r) { return r.losses(); });
  s += "<h2>MFU over time</h2>\n" + legend(rep) +
       time_chart(rep, "mfu-chart", "MFU over time", "MFU (%)", true, [](const BenchRun& r) {
         std::vector<double> pct(r.step_mfu().begin(), r.step_mfu().end());
         for (double& v : pct) v *= 100;
         return pct;
       });
  s += "<h2>Incident timeline</h2>\n" + timeline(rep);
  s += "<h2>Incidents</h2>\n" + incident_table(rep);
  return s + "</body>\n</html>\n";
}

}  // namespace keel::bench
