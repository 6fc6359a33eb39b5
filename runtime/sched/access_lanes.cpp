#include "sched/access_lanes.h"

#include <algorithm>

#include "common/assert.h"

namespace strata::sched {

namespace {

constexpr uint32_t kWordBits = 64;

}  // namespace

void AccessLanes::reset(const AccessSchedule& schedule, uint32_t lanes) {
  STRATA_ASSERT(lanes <= kMaxLanes);
  const uint32_t n = schedule.access_count();
  lane_count_ = lanes;
  lane_.assign(n, static_cast<uint8_t>(kNoLane));
  phase_.resize(n);
  const uint32_t words = (n + kWordBits - 1) / kWordBits;
  words_.assign(size_t{words} * lanes, 0);
  summary_.assign(size_t{(words + kWordBits - 1) / kWordBits} * lanes, 0);
  uint32_t slots = 0;
  for (uint32_t p = 0; p < schedule.phase_count(); ++p) {
    for (uint32_t i = schedule.access_begin(p); i < schedule.access_begin(p + 1); ++i) {
      phase_[i] = p;
      slots = std::max(slots, schedule.access(i).tensor.index + 1);
    }
  }
  // Reads per slot, in compressed rows (overwrites never have a lane).
  begin_.assign(size_t{slots} + 1, 0);
  for (uint32_t i = 0; i < n; ++i) {
    const Access& a = schedule.access(i);
    if (a.mode == AccessMode::kRead) ++begin_[a.tensor.index + 1];
  }
  for (uint32_t s = 0; s < slots; ++s) begin_[s + 1] += begin_[s];
  reads_.resize(begin_[slots]);
  std::vector<uint32_t> fill(begin_.begin(), begin_.end() - 1);
  for (uint32_t i = 0; i < n; ++i) {
    const Access& a = schedule.access(i);
    if (a.mode == AccessMode::kRead) reads_[fill[a.tensor.index]++] = i;
  }
}

std::span<const uint32_t> AccessLanes::reads_of(uint32_t slot) const {
  if (slot + size_t{1} >= begin_.size()) return {};
  return std::span<const uint32_t>(reads_.data() + begin_[slot], begin_[slot + 1] - begin_[slot]);
}

uint32_t AccessLanes::lane(uint32_t position) const {
  STRATA_ASSERT(position < size());
  return lane_[position];
}

void AccessLanes::set(uint32_t position, uint32_t lane) {
  STRATA_ASSERT(position < size() && (lane < lane_count_ || lane == kNoLane));
  const uint32_t was = lane_[position];
  if (lane == was) return;
  const uint32_t w = position / kWordBits;
  const size_t word = size_t{w} * lane_count_;
  const uint64_t mask = uint64_t{1} << (position % kWordBits);
  const size_t summary = size_t{w / kWordBits} * lane_count_;
  const uint64_t summary_mask = uint64_t{1} << (w % kWordBits);
  if (was != kNoLane) {
    words_[word + was] &= ~mask;
    if (words_[word + was] == 0) summary_[summary + was] &= ~summary_mask;
  }
  if (lane != kNoLane) {
    words_[word + lane] |= mask;
    summary_[summary + lane] |= summary_mask;
  }
  lane_[position] = static_cast<uint8_t>(lane);
}

bool AccessLanes::bitsets_match_lanes() const {
  std::vector<uint64_t> words(words_.size(), 0);
  std::vector<uint64_t> summary(summary_.size(), 0);
  for (uint32_t position = 0; position < size(); ++position) {
    const uint32_t lane = lane_[position];
    if (lane == kNoLane) continue;
    const uint32_t w = position / kWordBits;
    words[size_t{w} * lane_count_ + lane] |= uint64_t{1} << (position % kWordBits);
    summary[size_t{w / kWordBits} * lane_count_ + lane] |= uint64_t{1} << (w % kWordBits);
  }
  return words == words_ && summary == summary_;
}

uint32_t AccessLanes::next(uint32_t from, uint32_t end, uint64_t lanes) const {
  STRATA_ASSERT(end <= size());
  if (from >= end || lanes == 0) return end;
  // The bits of `lanes` in word `word` of a bitset laid out as words_ and summary_ are.
  const auto gather = [&](const std::vector<uint64_t>& bitset, uint32_t word) {
    const uint64_t* row = bitset.data() + size_t{word} * lane_count_;
    uint64_t bits = 0;
    for (uint64_t rest = lanes; rest != 0; rest &= rest - 1) bits |= row[__builtin_ctzll(rest)];
    return bits;
  };
  const uint32_t last_word = (end - 1) / kWordBits;
  uint32_t word = from / kWordBits;
  uint64_t bits = gather(words_, word) & (~uint64_t{0} << (from % kWordBits));
  while (bits == 0) {
    // The next word with a bit in any of the lanes, from the summary: a window's stretch of
    // empty words (the accesses whose links are full) costs a load per 4,096 positions.
    if (word == last_word) return end;
    ++word;
    uint32_t block = word / kWordBits;
    uint64_t words_set = gather(summary_, block) & (~uint64_t{0} << (word % kWordBits));
    while (words_set == 0) {
      if (++block > last_word / kWordBits) return end;
      words_set = gather(summary_, block);
    }
    word = block * kWordBits + static_cast<uint32_t>(__builtin_ctzll(words_set));
    if (word > last_word) return end;
    bits = gather(words_, word);
  }
  const uint32_t position = word * kWordBits + static_cast<uint32_t>(__builtin_ctzll(bits));
  return std::min(position, end);
}

}  // namespace strata::sched
