#pragma once
// RankViews as JSON, for agents to share their ranks' collectives with the other nodes of a
// job (watch/collective_exchange.hpp). Internal to the launcher.

#include <string>
#include <vector>

#include "diagnosis/rank_view.hpp"

namespace ddp::launcher {

// Compact: fields at their defaults are left out, ages and times kept to the millisecond, and
// the recent steps (up to 64 a rank, most of a view's bytes) only when with_steps.
std::string encode_views(const std::vector<RankView>& views, bool with_steps = true);
// Throws std::invalid_argument naming what is wrong when text is not what encode_views wrote.
std::vector<RankView> decode_views(const std::string& text);

// Every age in views grown by seconds (a view received that long ago).
void age_views(std::vector<RankView>& views, double seconds);
void age_view(RankView& view, double seconds);

}  // namespace ddp::launcher
