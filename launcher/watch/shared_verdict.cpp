#include "watch/shared_verdict.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace ddp::launcher {
namespace {

// Ranks as [first, last] ranges, at most kVerdictRanges of them.
nlohmann::json rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  nlohmann::json ranges = nlohmann::json::array();
  for (std::size_t i = 0; i < ranks.size() && ranges.size() < kVerdictRanges;) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    ranges.push_back({ranks[i], ranks[j]});
    i = j + 1;
  }
  return ranges;
}

}  // namespace

std::string encode_verdict(const SharedVerdict& verdict) {
  const std::optional<CollectiveDiagnosis>& d = verdict.diagnosis;
  nlohmann::json j = {{"by", verdict.by}, {"hung", d.has_value()}};
  if (d) {
    j["headline"] = d->headline;
    j["desync"] = d->desync;
    j["blamed"] = rank_ranges(d->blamed);
    if (d->collective) j["collective"] = *d->collective;
  }
  return j.dump();
}

SharedVerdict decode_verdict(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    SharedVerdict v;
    v.by = j.at("by").get<int>();
    if (!j.at("hung").get<bool>()) return v;
    CollectiveDiagnosis d;
    d.headline = j.at("headline").get<std::string>();
    d.desync = j.at("desync").get<bool>();
    for (const auto& range : j.at("blamed")) {
      for (int r = range.at(0).get<int>(); r <= range.at(1).get<int>(); ++r) d.blamed.push_back(r);
    }
    if (j.contains("collective")) d.collective = j["collective"].get<std::uint64_t>();
    v.diagnosis = std::move(d);
    return v;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("not the gatherer's verdict: ") + e.what());
  }
}

}  // namespace ddp::launcher
