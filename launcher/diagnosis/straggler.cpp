#include "diagnosis/straggler.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace ddp::launcher {
namespace {

std::string ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f ms", seconds * 1000.0);
  return text;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

}  // namespace

std::string Straggler::text() const {
  return who + " is a straggler: its gradients were ready " + ms(late_by_s) +
         " after the median rank's in " + std::to_string(late_steps) + " of the last " +
         std::to_string(window) + " steps (compute " + ms(compute_s) + " a step against " +
         ms(median_s) + "), as of step " + std::to_string(last_step);
}

std::optional<Straggler> find_straggler(const std::vector<RankView>& ranks,
                                        const StragglerOptions& options) {
  std::vector<const RankView*> recording;
  for (const RankView& r : ranks) {
    if (r.attached && !r.recent_steps.empty()) recording.push_back(&r);
  }
  if (recording.size() < 2 || options.window <= 0) return std::nullopt;
  // step -> compute time of each recording rank (in `recording` order)
  std::map<std::uint64_t, std::vector<double>> by_step;
  for (std::size_t i = 0; i < recording.size(); ++i) {
    for (const StepInfo& s : recording[i]->recent_steps) {
      auto& row = by_step[s.step];
      row.resize(recording.size(), -1.0);
      row[i] = s.compute_s;
    }
  }
  std::vector<std::pair<std::uint64_t, std::vector<double>>> complete;
  for (auto& [step, row] : by_step) {
    if (row.size() == recording.size() &&
        std::none_of(row.begin(), row.end(), [](double v) { return v < 0; })) {
      complete.emplace_back(step, row);
    }
  }
  if (complete.size() < static_cast<std::size_t>(options.window)) return std::nullopt;
  complete.erase(complete.begin(), complete.end() - options.window);

  struct Tally {
    int late = 0;            // steps late
    double late_sum = 0;     // by how much, summed over those steps
    double compute_sum = 0;  // its compute time, summed over the window
  };
  std::vector<Tally> tally(recording.size());
  double median_sum = 0;
  for (const auto& [step, row] : complete) {
    // Two ranks: the faster one is the reference; more: the median.
    const double reference = row.size() == 2 ? std::min(row[0], row[1]) : median(row);
    median_sum += reference;
    const double threshold = std::max(options.threshold_s, 0.2 * reference);
    for (std::size_t i = 0; i < row.size(); ++i) {
      tally[i].compute_sum += row[i];
      if (row[i] - reference > threshold) {
        ++tally[i].late;
        tally[i].late_sum += row[i] - reference;
      }
    }
  }
  const auto most_late = std::max_element(
      tally.begin(), tally.end(), [](const Tally& a, const Tally& b) { return a.late < b.late; });
  const std::size_t worst = static_cast<std::size_t>(most_late - tally.begin());
  const Tally& t = *most_late;
  if (t.late * 2 <= options.window) return std::nullopt;
  const RankView& r = *recording[worst];
  Straggler s;
  s.rank = r.rank;
  s.who = rank_who(r);
  s.late_steps = t.late;
  s.window = options.window;
  s.late_by_s = t.late_sum / t.late;
  s.compute_s = t.compute_sum / options.window;
  s.median_s = median_sum / options.window;
  s.last_step = complete.back().first;
  return s;
}

std::string step_summary(std::vector<RankView> ranks) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankView& a, const RankView& b) { return a.rank < b.rank; });
  std::string text;
  for (const RankView& r : ranks) {
    if (!r.attached || r.steps == 0) continue;
    char line[160];
    std::snprintf(line, sizeof line,
                  "\n  rank %d: %llu steps, compute %.2f s, wait %.2f s (%.0f %%)", r.rank,
                  static_cast<unsigned long long>(r.steps), r.compute_s_total, r.wait_s_total,
                  r.compute_s_total + r.wait_s_total > 0
                      ? 100.0 * r.wait_s_total / (r.compute_s_total + r.wait_s_total)
                      : 0.0);
    text += line;
  }
  return text.empty() ? ""
                      : "time in Reducer steps, per rank (compute: until the last bucket "
                        "was ready; wait: then until finalize() returned):" +
                            text;
}

}  // namespace ddp::launcher
