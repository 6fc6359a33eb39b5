#include "sched/access_schedule.h"

#include <gtest/gtest.h>

#include "sched/tensor_registry.h"

namespace strata::sched {
namespace {

TensorHandle h(uint32_t index, uint32_t generation = 1) {
  return {index, generation};
}

// F0: a b | F1: c | B1: c(dev) | B0: a b(dev), g(overwrite) | O: a(pinned) g(pinned)
AccessSchedule sample() {
  AccessSchedule::Builder b;
  b.begin_phase({PhaseKind::kForward, 0});
  EXPECT_TRUE(b.add({h(0), Tier::kDevice, AccessMode::kRead}).is_ok());
  EXPECT_TRUE(b.add({h(1), Tier::kDevice, AccessMode::kRead}).is_ok());
  b.begin_phase({PhaseKind::kForward, 1});
  EXPECT_TRUE(b.add({h(2), Tier::kDevice, AccessMode::kRead}).is_ok());
  b.begin_phase({PhaseKind::kBackward, 1});
  EXPECT_TRUE(b.add({h(2), Tier::kDevice, AccessMode::kRead}).is_ok());
  b.begin_phase({PhaseKind::kBackward, 0});
  EXPECT_TRUE(b.add({h(0), Tier::kDevice, AccessMode::kRead}).is_ok());
  EXPECT_TRUE(b.add({h(1), Tier::kDevice, AccessMode::kRead}).is_ok());
  EXPECT_TRUE(b.add({h(3), Tier::kDevice, AccessMode::kOverwrite}).is_ok());
  b.begin_phase({PhaseKind::kOptimizer, 0});
  EXPECT_TRUE(b.add({h(0), Tier::kPinned, AccessMode::kRead}).is_ok());
  EXPECT_TRUE(b.add({h(3), Tier::kPinned, AccessMode::kRead}).is_ok());
  Result<AccessSchedule> s = std::move(b).build();
  EXPECT_TRUE(s.is_ok());
  return std::move(s).value();
}

TEST(AccessSchedule, NextReadCountsPhasesAndWrapsIntoTheNextStep) {
  const AccessSchedule s = sample();
  ASSERT_EQ(s.phase_count(), 5u);
  EXPECT_EQ(s.next_read(h(0), UseFilter::kAnyTier, 0), 0u);  // used in phase 0 itself
  EXPECT_EQ(s.next_read(h(0), UseFilter::kAnyTier, 1), 2u);  // backward 0 is phase 3
  EXPECT_EQ(s.next_read(h(0), UseFilter::kAnyTier, 4), 0u);  // optimizer reads it on pinned
  EXPECT_EQ(s.next_read(h(0), UseFilter::kDevice, 4), 1u);   // next step's forward 0
  EXPECT_EQ(s.next_read(h(2), UseFilter::kAnyTier, 3), 3u);  // wraps to forward 1
  EXPECT_EQ(s.next_read(h(1), UseFilter::kPinned, 0), kNeverUsed);
}

TEST(AccessSchedule, OverwritesAreNotReads) {
  const AccessSchedule s = sample();
  // Tensor 3 is overwritten in backward 0 and read in the optimizer only.
  EXPECT_EQ(s.next_read(h(3), UseFilter::kAnyTier, 0), 4u);
  EXPECT_EQ(s.next_read(h(3), UseFilter::kDevice, 0), kNeverUsed);
}

TEST(AccessSchedule, StaleAndUnknownHandlesAreNeverUsed) {
  const AccessSchedule s = sample();
  EXPECT_EQ(s.next_read(h(0, 2), UseFilter::kAnyTier, 0), kNeverUsed);
  EXPECT_EQ(s.next_read(h(99), UseFilter::kAnyTier, 0), kNeverUsed);
  EXPECT_EQ(s.next_read(TensorHandle{}, UseFilter::kAnyTier, 0), kNeverUsed);
  EXPECT_TRUE(s.mentions(h(3)));
  EXPECT_FALSE(s.mentions(h(3, 7)));
}

TEST(AccessSchedule, FindPhaseWrapsAndHandlesRepeatedKeys) {
  AccessSchedule::Builder b;
  for (int i = 0; i < 3; ++i) {
    b.begin_phase({PhaseKind::kOptimizer, 5});
    ASSERT_TRUE(b.add({h(i), Tier::kPinned, AccessMode::kRead}).is_ok());
  }
  b.begin_phase({PhaseKind::kForward, 0});
  ASSERT_TRUE(b.add({h(9), Tier::kDevice, AccessMode::kRead}).is_ok());
  Result<AccessSchedule> s = std::move(b).build();
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->find_phase({PhaseKind::kOptimizer, 5}, 0), 0u);
  EXPECT_EQ(s->find_phase({PhaseKind::kOptimizer, 5}, 1), 1u);
  EXPECT_EQ(s->find_phase({PhaseKind::kOptimizer, 5}, 3), 0u);  // wraps
  EXPECT_EQ(s->find_phase({PhaseKind::kForward, 0}, 0), 3u);
  EXPECT_FALSE(s->find_phase({PhaseKind::kBackward, 0}, 0).has_value());
}

TEST(AccessSchedule, RepeatsWithinAPhaseKeepTheFirstAccess) {
  AccessSchedule::Builder b;
  b.begin_phase({PhaseKind::kForward, 0});
  ASSERT_TRUE(b.add({h(1), Tier::kDevice, AccessMode::kOverwrite}).is_ok());
  ASSERT_TRUE(b.add({h(1), Tier::kDevice, AccessMode::kRead}).is_ok());
  ASSERT_TRUE(b.add({h(1), Tier::kPinned, AccessMode::kRead}).is_ok());
  Result<AccessSchedule> s = std::move(b).build();
  ASSERT_TRUE(s.is_ok());
  ASSERT_EQ(s->phase_accesses(0).size(), 2u);
  EXPECT_EQ(s->phase_accesses(0)[0].mode, AccessMode::kOverwrite);
  EXPECT_EQ(s->next_read(h(1), UseFilter::kDevice, 0), kNeverUsed);
  EXPECT_EQ(s->next_read(h(1), UseFilter::kPinned, 0), 0u);
}

TEST(AccessSchedule, BadInputIsRejected) {
  AccessSchedule::Builder b;
  EXPECT_EQ(b.add({h(1), Tier::kNvme, AccessMode::kRead}).code(), STRATA_E_INVALID);
  EXPECT_EQ(b.add({TensorHandle{}, Tier::kPinned, AccessMode::kRead}).code(), STRATA_E_INVALID);
  EXPECT_EQ(std::move(b).build().status().code(), STRATA_E_INVALID);  // empty
}

TEST(AccessSchedule, AccessesOutsideAPhaseGoToAnImplicitOne) {
  AccessSchedule::Builder b;
  ASSERT_TRUE(b.add({h(4), Tier::kPinned, AccessMode::kRead}).is_ok());
  Result<AccessSchedule> s = std::move(b).build();
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->phase_count(), 1u);
  EXPECT_EQ(s->phase_key(0).kind, PhaseKind::kOther);
}

TEST(TensorRegistry, StaleHandlesAreDetectedAfterSlotReuse) {
  TensorRegistry registry(4, 0);
  TensorSpec spec;
  spec.name = "a";
  spec.shape = {16};
  Result<TensorHandle> a = registry.add(spec, {});
  ASSERT_TRUE(a.is_ok());
  registry.remove(*a);
  EXPECT_EQ(registry.resolve(*a).status().code(), STRATA_E_BAD_HANDLE);
  Result<TensorHandle> b = registry.add(spec, {});
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->index, a->index);            // the slot is reused...
  EXPECT_NE(b->generation, a->generation);  // ...under a new generation
  EXPECT_EQ(registry.resolve(*a).status().code(), STRATA_E_BAD_HANDLE);
  EXPECT_TRUE(registry.resolve(*b).is_ok());
  EXPECT_EQ(registry.resolve(TensorHandle{}).status().code(), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(registry.resolve(TensorHandle::from_u64(b->to_u64())).value(), b->index);
}

TEST(TensorRegistry, LimitAndZeroSizeAreErrors) {
  TensorRegistry registry(1, 0);
  TensorSpec spec;
  spec.name = "a";
  spec.shape = {0};
  EXPECT_EQ(registry.add(spec, {}).status().code(), STRATA_E_INVALID);
  spec.shape = {8};
  ASSERT_TRUE(registry.add(spec, {}).is_ok());
  EXPECT_EQ(registry.add(spec, {}).status().code(), STRATA_E_LIMIT);
  RegisterOptions sized;
  sized.bytes = 12345;
  TensorRegistry other(1, 0);
  Result<TensorHandle> c = other.add(spec, sized);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(other.at(c->index).bytes, 12345u);
}

}  // namespace
}  // namespace strata::sched
