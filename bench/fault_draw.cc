#include "bench/fault_draw.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace keel::bench {

faults::FaultSchedule draw_schedule(double mtbf_s, double step_s, int64_t steps, int world,
                                    const std::vector<std::string>& kinds, uint64_t seed) {
  faults::FaultSchedule s;
  if (mtbf_s <= 0 || step_s <= 0 || kinds.empty() || world < 1) return s;
  std::mt19937_64 gen(seed);
  std::exponential_distribution<double> gap(step_s / mtbf_s);  // failures per step
  std::uniform_int_distribution<size_t> kind(0, kinds.size() - 1);
  std::uniform_int_distribution<int> rank(0, world - 1);
  double at = 0;
  int64_t last = 0;
  for (;;) {
    at += gap(gen);
    // A mean time between failures far longer than the job draws a gap past its end (or an
    // infinite one): stop before the cast to a step, which such a value would overflow.
    if (!(at < double(steps))) break;
    const int64_t step = std::max<int64_t>(last + 1, int64_t(std::floor(at)));
    if (step >= steps) break;
    faults::Fault::Kind k = faults::Fault::crash;
    faults::Fault::Kind_Parse(kinds[kind(gen)], &k);
    faults::Fault* f = s.add_fault();
    f->set_kind(k);
    f->set_step(step);
    f->set_rank(rank(gen));
    if (k == faults::Fault::slow || k == faults::Fault::slow_link) f->set_delay_ms(60);
    last = step;
  }
  return s;
}

}  // namespace keel::bench
