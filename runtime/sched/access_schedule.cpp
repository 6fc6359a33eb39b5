#include "sched/access_schedule.h"

#include <algorithm>
#include <tuple>

#include "common/assert.h"

namespace strata::sched {

namespace {

auto key_order(const PhaseKey& key) {
  return std::make_tuple(static_cast<int>(key.kind), key.layer);
}

}  // namespace

const char* to_string(PhaseKind kind) {
  switch (kind) {
    case PhaseKind::kForward:
      return "forward";
    case PhaseKind::kBackward:
      return "backward";
    case PhaseKind::kOptimizer:
      return "optimizer";
    case PhaseKind::kOther:
      return "other";
  }
  return "?";
}

void AccessSchedule::Builder::begin_phase(PhaseKey key) {
  phase_keys_.push_back(key);
  phase_begin_.push_back(static_cast<uint32_t>(accesses_.size()));
}

Status AccessSchedule::Builder::add(const Access& access) {
  if (access.tier == Tier::kNvme)
    return invalid_argument("a schedule access must be on pinned or device");
  if (access.tensor.generation == 0) return invalid_argument("a schedule access needs a tensor");
  if (accesses_.size() >= kMaxAccesses) {
    return Status::error(STRATA_E_LIMIT,
                         "schedule has more than " + std::to_string(kMaxAccesses) + " accesses");
  }
  if (phase_keys_.empty()) begin_phase(PhaseKey{});
  accesses_.push_back(access);
  return Status::ok();
}

Result<AccessSchedule> AccessSchedule::Builder::build() && {
  if (accesses_.empty()) return invalid_argument("an access schedule needs at least one access");
  if (phase_keys_.size() > kMaxPhases) {
    return Status::error(STRATA_E_LIMIT,
                         "schedule has more than " + std::to_string(kMaxPhases) + " phases");
  }
  AccessSchedule s;
  const uint32_t phases = static_cast<uint32_t>(phase_keys_.size());
  s.phase_keys_ = std::move(phase_keys_);
  s.phase_begin_.reserve(phases + 1);
  s.accesses_.reserve(accesses_.size());

  // Per phase: keep the first access of each (tensor, tier), in order.
  std::vector<std::pair<uint64_t, uint32_t>> seen;  // (tensor u64 * 4 + tier, position)
  uint32_t max_slot = 0;
  for (uint32_t p = 0; p < phases; ++p) {
    const uint32_t begin = phase_begin_[p];
    const uint32_t end =
        p + 1 < phases ? phase_begin_[p + 1] : static_cast<uint32_t>(accesses_.size());
    seen.clear();
    for (uint32_t i = begin; i < end; ++i) {
      seen.emplace_back(accesses_[i].tensor.to_u64() * 4 + static_cast<uint64_t>(accesses_[i].tier),
                        i);
    }
    std::stable_sort(seen.begin(), seen.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<bool> keep(end - begin, false);
    for (size_t k = 0; k < seen.size(); ++k) {
      if (k == 0 || seen[k].first != seen[k - 1].first) keep[seen[k].second - begin] = true;
    }
    s.phase_begin_.push_back(static_cast<uint32_t>(s.accesses_.size()));
    for (uint32_t i = begin; i < end; ++i) {
      if (!keep[i - begin]) continue;
      s.accesses_.push_back(accesses_[i]);
      max_slot = std::max(max_slot, accesses_[i].tensor.index);
    }
  }
  s.phase_begin_.push_back(static_cast<uint32_t>(s.accesses_.size()));

  // The newest generation per slot owns the slot's uses (older ones were unregistered).
  const uint32_t slots = max_slot + 1;
  s.slot_generation_.assign(slots, 0);
  for (const Access& a : s.accesses_) {
    s.slot_generation_[a.tensor.index] =
        std::max(s.slot_generation_[a.tensor.index], a.tensor.generation);
  }

  // Compressed rows of reading phases per filter. Phases are visited in order, so each row comes
  // out sorted; a repeat within a phase is skipped by comparing with the row's last entry.
  for (int f = 0; f < kUseFilterCount; ++f) {
    std::vector<uint32_t>& begin = s.use_begin_[f];
    std::vector<uint32_t>& uses = s.uses_[f];
    begin.assign(slots + 1, 0);
    auto counts = [&](const Access& a) {
      if (a.mode != AccessMode::kRead) return false;
      if (a.tensor.generation != s.slot_generation_[a.tensor.index]) return false;
      const UseFilter filter = static_cast<UseFilter>(f);
      return filter == UseFilter::kAnyTier || filter == filter_for(a.tier);
    };
    std::vector<uint32_t> last(slots, UINT32_MAX);
    for (uint32_t p = 0; p < phases; ++p) {
      for (uint32_t i = s.phase_begin_[p]; i < s.phase_begin_[p + 1]; ++i) {
        const Access& a = s.accesses_[i];
        if (!counts(a) || last[a.tensor.index] == p) continue;
        last[a.tensor.index] = p;
        ++begin[a.tensor.index + 1];
      }
    }
    for (uint32_t slot = 0; slot < slots; ++slot) begin[slot + 1] += begin[slot];
    uses.assign(begin[slots], 0);
    std::vector<uint32_t> fill(begin.begin(), begin.end() - 1);
    std::fill(last.begin(), last.end(), UINT32_MAX);
    for (uint32_t p = 0; p < phases; ++p) {
      for (uint32_t i = s.phase_begin_[p]; i < s.phase_begin_[p + 1]; ++i) {
        const Access& a = s.accesses_[i];
        if (!counts(a) || last[a.tensor.index] == p) continue;
        last[a.tensor.index] = p;
        uses[fill[a.tensor.index]++] = p;
      }
    }
  }

  s.keyed_phases_.reserve(phases);
  for (uint32_t p = 0; p < phases; ++p) s.keyed_phases_.push_back({s.phase_keys_[p], p});
  std::sort(s.keyed_phases_.begin(), s.keyed_phases_.end(),
            [](const KeyedPhase& a, const KeyedPhase& b) {
              return std::make_tuple(key_order(a.key), a.phase) <
                     std::make_tuple(key_order(b.key), b.phase);
            });
  return s;
}

std::span<const Access> AccessSchedule::phase_accesses(uint32_t phase) const {
  STRATA_ASSERT(phase < phase_count());
  return std::span<const Access>(accesses_.data() + phase_begin_[phase],
                                 phase_begin_[phase + 1] - phase_begin_[phase]);
}

uint32_t AccessSchedule::access_begin(uint32_t phase) const {
  STRATA_ASSERT(phase <= phase_count());
  return phase_begin_[phase];
}

const Access& AccessSchedule::access(uint32_t position) const {
  STRATA_ASSERT(position < access_count());
  return accesses_[position];
}

std::optional<uint32_t> AccessSchedule::find_phase(PhaseKey key, uint32_t from) const {
  auto less_key = [](const KeyedPhase& kp, const PhaseKey& k) {
    return key_order(kp.key) < key_order(k);
  };
  auto first = std::lower_bound(keyed_phases_.begin(), keyed_phases_.end(), key, less_key);
  if (first == keyed_phases_.end() || !(first->key == key)) return std::nullopt;
  auto last = first;
  // Equal keys are contiguous and sorted by phase; find the first with phase >= from.
  auto end = std::upper_bound(
      first, keyed_phases_.end(), key,
      [](const PhaseKey& k, const KeyedPhase& kp) { return key_order(k) < key_order(kp.key); });
  last = std::lower_bound(first, end, from,
                          [](const KeyedPhase& kp, uint32_t phase) { return kp.phase < phase; });
  if (last == end) return first->phase;  // wraps into the next step
  return last->phase;
}

uint64_t AccessSchedule::next_read(TensorHandle tensor, UseFilter filter, uint32_t from) const {
  if (tensor.index >= slot_generation_.size() ||
      slot_generation_[tensor.index] != tensor.generation || tensor.generation == 0) {
    return kNeverUsed;
  }
  const int f = static_cast<int>(filter);
  const uint32_t* begin = uses_[f].data() + use_begin_[f][tensor.index];
  const uint32_t* end = uses_[f].data() + use_begin_[f][tensor.index + 1];
  if (begin == end) return kNeverUsed;
  const uint32_t* it = std::lower_bound(begin, end, from);
  if (it != end) return *it - from;
  return uint64_t{*begin} + phase_count() - from;
}

bool AccessSchedule::mentions(TensorHandle tensor) const {
  return tensor.index < slot_generation_.size() && tensor.generation != 0 &&
         slot_generation_[tensor.index] == tensor.generation;
}

}  // namespace strata::sched
