// Activation offload (`--activation-offload pinned|nvme`): the GPU keeps one layer's saved
// activations, the rest cross PCIe out and back each micro-batch, in copies the compute stream
// waits for, and rest in pinned memory or on NVMe, where they count for the drives' time and wear.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/align.h"
#include "model/plan.h"
#include "model/plan_headroom.h"
#include "model/plan_offload.h"

namespace strata {
namespace {

// An 8B QLoRA at 8K on a 4090 without checkpointing: 48 GB of saved activations, which do not
// fit the GPU unless they leave it.
PlanRequest qlora_8b_at_8k(ActivationOffload home) {
  PlanRequest r;
  r.model = *load_model("llama-3.1-8b");
  r.method = FinetuneMethod::kQLora;
  r.seq_len = 8192;
  r.grad_accum = 2;
  r.checkpointing = Checkpointing::kNone;
  r.activation_offload = home;
  r.offload = Offload::kNone;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("1:gen4");
  return r;
}

GpuPlan plan_of(const PlanRequest& r) {
  Result<Plan> p = make_gpu_plans(r);
  EXPECT_TRUE(p.is_ok()) << p.status().message();
  return p.is_ok() ? p->gpus[0] : GpuPlan{};
}

TEST(ActivationOffload, TheGpuKeepsOneLayersActivationsAndTheRestCrossPcieEachMicroBatch) {
  const PlanRequest r = qlora_8b_at_8k(ActivationOffload::kPinned);
  const ModelConfig& m = r.model;
  const SavedInputs adapters = saved_inputs(r.method, r.lora_targets, r.lora_rank);
  const uint64_t all = activation_bytes(m, 8192, 1, Checkpointing::kNone, DType::kBFloat16,
                                        Attention::kFlash, adapters);
  const uint64_t layer =
      activation_bytes_per_layer(m, 8192, 1, DType::kBFloat16, Attention::kFlash, false, adapters);
  EXPECT_EQ(all, m.num_hidden_layers * layer);

  EXPECT_FALSE(plan_of(qlora_8b_at_8k(ActivationOffload::kNone)).fits_gpu);
  const GpuPlan g = plan_of(r);
  EXPECT_TRUE(g.fits());
  EXPECT_EQ(g.memory.activations, layer);
  EXPECT_EQ(g.activations_offloaded_bytes, all - layer);
  // Out in forward and back in backward, per micro-batch.
  EXPECT_EQ(g.stages.pcie_d2h_bytes, 2 * (all - layer));
  EXPECT_EQ(g.stages.pcie_h2d_bytes, 2 * (all - layer));
  EXPECT_GT(g.stages.pcie_seconds, 0);
  // One micro-batch's rest in pinned memory; nothing touches the drives.
  EXPECT_EQ(g.host_bytes, align_up(all - layer, kPageSize));
  ASSERT_EQ(g.stages.host_breakdown.size(), 1u);
  EXPECT_EQ(g.stages.host_breakdown[0].what, "activations");
  EXPECT_EQ(g.stages.nvme_write_bytes, 0u);
  EXPECT_EQ(g.nvme_wear.write_bytes_per_step, 0u);
  // The copies block the compute stream (strata.torch copies each saved tensor with a plain
  // copy_): the GPU's time is compute plus both directions' copies, not the larger of the two.
  EXPECT_NEAR(g.stages.activation_copy_seconds, 2.0 * 2 * (all - layer) / (g.job.pcie_gbps * 1e9),
              1e-9);
  EXPECT_DOUBLE_EQ(g.step_seconds, g.stages.compute_seconds + g.stages.activation_copy_seconds);
  EXPECT_EQ(g.bottleneck, "compute");
  // Without activation offload nothing is copied on the stream.
  PlanRequest fits = qlora_8b_at_8k(ActivationOffload::kNone);
  fits.seq_len = 1024;
  EXPECT_EQ(plan_of(fits).stages.activation_copy_seconds, 0.0);
}

// With the states on the GPU (or in RAM) the closed form would take the drive's time as
// overlapped with compute wholly; the simulated step of the activations alone, through the
// runtime's drive-sized pinned pool, says how long the GPU waits for them.
TEST(ActivationOffload, ToNvmeWithTheStatesOnTheGpuTheirWayThroughThePoolIsSimulated) {
  constexpr auto kActivations = static_cast<size_t>(TensorKind::kActivationCheckpoint);
  const PlanRequest r = qlora_8b_at_8k(ActivationOffload::kNvme);
  const GpuPlan g = plan_of(r);
  ASSERT_TRUE(g.fits()) << g.why_not;
  ASSERT_EQ(g.offload, Offload::kNone);
  const uint64_t moved = g.activations_offloaded_bytes;
  ASSERT_GT(moved, 0u);
  // Host RAM: the pool they pass through, the runtime's automatic budget (the drive's figure).
  const uint64_t pool =
      strata_pinned_sizing(7.0, 4.3, r.assume.optimizer_threads, r.assume.drive_queue_depth)
          .budget_bytes;
  EXPECT_EQ(g.stages.pinned_budget_bytes, pool);
  EXPECT_GT(g.host_bytes, 0u);
  EXPECT_LE(g.host_bytes, pool);
  EXPECT_EQ(g.host_bytes, g.stages.peak_pinned_bytes);
  ASSERT_FALSE(g.stages.pinned_derivation.empty());
  // What the pool cannot keep is written and read back: at most once a micro-batch (2 here),
  // every byte the drives move an activation's.
  EXPECT_GT(g.stages.nvme_write_bytes, moved);
  EXPECT_LE(g.stages.nvme_write_bytes, 2 * moved);
  EXPECT_EQ(g.stages.nvme_write_by_kind[kActivations], g.stages.nvme_write_bytes);
  EXPECT_GT(g.stages.nvme_read_bytes, moved);
  EXPECT_LE(g.stages.nvme_read_bytes, g.stages.nvme_write_bytes);
  EXPECT_EQ(g.nvme_wear.write_bytes_per_step, g.stages.nvme_write_bytes);
  EXPECT_EQ(g.nvme_bytes, align_up(moved, kPageSize));
  // The drive cannot run ahead of forward's packs or behind backward's unpacks: the GPU waits,
  // and the step is the simulated one, longer than the drive's busy time the closed form took.
  EXPECT_GT(g.stages.activations_alone_step_seconds, 0);
  EXPECT_DOUBLE_EQ(g.step_seconds, g.stages.activations_alone_step_seconds);
  EXPECT_GT(g.stages.stall_seconds, 0);
  EXPECT_GT(g.step_seconds, g.stages.nvme_seconds);
  EXPECT_GE(g.step_seconds, g.stages.compute_seconds + g.stages.activation_copy_seconds);
  EXPECT_EQ(g.bottleneck, "nvme-write");
  // A QLoRA's weights resident under NVMe offload move nothing after the warm-up: that simulated
  // step moves about the same activations' bytes in about the same time (its scheduler also
  // has the weights' declared schedule and their NVMe home).
  PlanRequest under_nvme = r;
  under_nvme.offload = Offload::kNvme;
  const GpuPlan n = plan_of(under_nvme);
  ASSERT_TRUE(n.params_resident);
  EXPECT_NEAR(static_cast<double>(n.stages.nvme_write_by_kind[kActivations]),
              static_cast<double>(g.stages.nvme_write_bytes), 0.02 * g.stages.nvme_write_bytes);
  EXPECT_NEAR(n.step_seconds, g.step_seconds, 0.02 * g.step_seconds);
  // The weights rest on the device: a pool far smaller than a weight still carries the
  // activations (in chunks of an eighth of it), slower.
  PlanRequest small = r;
  small.strata_pinned_budget_bytes = uint64_t{16} << 20;
  const GpuPlan s = plan_of(small);
  ASSERT_TRUE(s.fits()) << s.why_not;
  EXPECT_LE(s.host_bytes, uint64_t{16} << 20);
  EXPECT_GT(s.step_seconds, g.step_seconds);
  // A pinned budget given is the pool: a larger one keeps more of them off the drives.
  PlanRequest larger = r;
  larger.strata_pinned_budget_bytes = 8 * pool;
  const GpuPlan l = plan_of(larger);
  EXPECT_EQ(l.stages.pinned_budget_bytes, 8 * pool);
  EXPECT_LT(l.stages.nvme_write_bytes, g.stages.nvme_write_bytes);
  EXPECT_GT(l.host_bytes, g.host_bytes);
}

// Under CPU offload the states stay in RAM (the closed form's) beside the pool, and the step is
// the slower of the closed form's and the activations' simulated one.
TEST(ActivationOffload, ToNvmeUnderCpuOffloadThePoolIsBesideTheStates) {
  PlanRequest r;
  r.model = *load_model("llama-2-7b");
  r.method = FinetuneMethod::kFull;
  r.seq_len = 8192;
  r.checkpointing = Checkpointing::kFull;
  r.activation_offload = ActivationOffload::kNvme;
  r.offload = Offload::kCpu;
  r.gpus = {*parse_gpu_choice("h100-sxm")};
  r.nvme = *parse_nvme("1:gen4");
  const GpuPlan g = plan_of(r);
  ASSERT_EQ(g.offload, Offload::kCpu);
  ASSERT_GT(g.stages.activations_alone_step_seconds, 0);
  uint64_t states = 0;
  for (const ByteItem& item : g.stages.host_breakdown) {
    if (item.what.find("pinned pool") == std::string::npos) states += item.bytes;
  }
  EXPECT_GE(states, 12 * g.job.trainable_params);  // fp32 master and Adam m, v at least
  EXPECT_EQ(g.host_bytes, states + g.stages.peak_pinned_bytes);
  EXPECT_GE(g.step_seconds, g.stages.activations_alone_step_seconds);
  EXPECT_GE(g.step_seconds, g.stages.cpu_optimizer_seconds);
  // Full speed: the states and the activations in RAM, no pool for a drive.
  EXPECT_EQ(g.host.full_speed_bytes, states + activations_held_bytes(g));
}

// --trace traces that simulation: the plan's activations bytes in the step the plan simulated.
TEST(ActivationOffload, ToNvmeWithTheStatesOnTheGpuTheTraceIsTheirSimulatedStep) {
  const PlanRequest r = qlora_8b_at_8k(ActivationOffload::kNvme);
  Result<Plan> plan = make_plan(r);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_GT(plan->gpus[0].stages.activations_alone_step_seconds, 0);
  const std::string path = ::testing::TempDir() + "activations_alone_trace.json";
  Result<telemetry::TraceStats> traced = write_strata_nvme_trace(*plan, path);
  ASSERT_TRUE(traced.is_ok()) << traced.status().message();
  EXPECT_GT(traced->recorded, 0u);
  EXPECT_EQ(traced->dropped, 0u);
  std::remove(path.c_str());
}

TEST(ActivationOffload, UnderFullCheckpointingTheLayerInputsMove) {
  PlanRequest r = qlora_8b_at_8k(ActivationOffload::kPinned);
  r.checkpointing = Checkpointing::kFull;
  const ModelConfig& m = r.model;
  const uint64_t input = 8192ull * m.hidden_size * 2;
  const uint64_t layer =
      activation_bytes_per_layer(m, 8192, 1, DType::kBFloat16, Attention::kFlash, false,
                                 saved_inputs(r.method, r.lora_targets, r.lora_rank));
  const GpuPlan g = plan_of(r);
  // The recomputed layer stays on the GPU beside its input; every other input leaves.
  EXPECT_EQ(g.memory.activations, input + layer);
  EXPECT_EQ(g.activations_offloaded_bytes, (m.num_hidden_layers - 1) * input);
}

// Under NVMe offload of the states the simulated step plays them (training_step.h's packs and
// unpacks): strata.torch's chunks through the runtime's pinned pool, each copy one the compute
// stream waits for, on the links the states' transfers use.
TEST(ActivationOffload, UnderNvmeOffloadTheSimulatedStepMovesThemBesideTheStates) {
  constexpr auto kActivations = static_cast<size_t>(TensorKind::kActivationCheckpoint);
  PlanRequest r = qlora_8b_at_8k(ActivationOffload::kPinned);
  r.offload = Offload::kNvme;
  const GpuPlan kept = plan_of(r);
  ASSERT_TRUE(kept.fits()) << kept.why_not;
  EXPECT_EQ(kept.stages.model, "simulated");
  const uint64_t moved = kept.activations_offloaded_bytes;
  ASSERT_GT(moved, 0u);
  // Out and back once a micro-batch (2), beside the states' transfers.
  EXPECT_GE(kept.stages.pcie_d2h_bytes, 2 * moved);
  EXPECT_GE(kept.stages.pcie_h2d_bytes, 2 * moved);
  EXPECT_GE(kept.stages.activation_copy_seconds, 2.0 * 2 * moved / (kept.job.pcie_gbps * 1e9));
  EXPECT_GE(kept.step_seconds + 1e-9,
            kept.stages.compute_seconds + kept.stages.activation_copy_seconds);
  // Kept in pinned memory: the automatic budget is the drive's plus one micro-batch's chunks,
  // and the drives never see them.
  EXPECT_EQ(kept.stages.nvme_write_by_kind[kActivations], 0u);
  EXPECT_GE(kept.stages.pinned_budget_bytes, moved);
  EXPECT_GE(kept.host_bytes, moved);
  ASSERT_FALSE(kept.stages.pinned_derivation.empty());
  EXPECT_NE(kept.stages.pinned_derivation.back().find("to set (the drive's figure and the "
                                                      "activations')"),
            std::string::npos)
      << kept.stages.pinned_derivation.back();
  // At least the step without them plus the copies the stream waits for.
  EXPECT_GT(kept.stages.states_only_step_seconds, 0.0);
  EXPECT_GE(kept.step_seconds + 1e-9,
            kept.stages.states_only_step_seconds + kept.stages.activation_copy_seconds);

  r.activation_offload = ActivationOffload::kNvme;
  const GpuPlan spilled = plan_of(r);
  ASSERT_TRUE(spilled.fits()) << spilled.why_not;
  // Through a pool of about a gigabyte: written, each at most once a micro-batch, read back
  // once, and counted for the wear and the space.
  const uint64_t written = spilled.stages.nvme_write_by_kind[kActivations];
  EXPECT_GT(written, moved);
  EXPECT_LE(written, 2 * moved);
  EXPECT_LE(spilled.stages.nvme_read_by_kind[kActivations], written);
  EXPECT_GE(spilled.nvme_wear.write_bytes_per_step, written);
  EXPECT_GE(spilled.nvme_bytes, kept.nvme_bytes + moved);
  EXPECT_LT(spilled.host_bytes, kept.host_bytes);
  EXPECT_GT(spilled.step_seconds, kept.step_seconds);

  // The comparison with DeepSpeed stays the model states' alone (its configurations offload no
  // activations): Strata's side is the job without activation offload, whose weights do not fit
  // the GPU beside every layer's activations, as DeepSpeed's columns stream them too.
  r.model = *load_model("llama-3.1-8b");
  r.method = FinetuneMethod::kFull;
  r.offload.reset();  // chosen: NVMe offload, now planned with them
  Result<Plan> full = make_plan(r);
  ASSERT_TRUE(full.is_ok()) << full.status().message();
  const GpuPlan& g = full->gpus[0];
  EXPECT_EQ(g.offload, Offload::kNvme);
  EXPECT_TRUE(g.fits()) << g.why_not;
  EXPECT_GT(g.stages.nvme_write_by_kind[kActivations], 0u);
  EXPECT_EQ(full->strata_nvme.nvme_write_by_kind[kActivations], 0u);
  EXPECT_EQ(full->strata_nvme.activation_copy_seconds, 0.0);
  PlanRequest without = r;
  without.activation_offload = ActivationOffload::kNone;
  without.offload = Offload::kNvme;
  Result<Plan> states_only = make_plan(without);
  ASSERT_TRUE(states_only.is_ok()) << states_only.status().message();
  EXPECT_EQ(full->strata_nvme.step_seconds, states_only->strata_nvme.step_seconds);
  EXPECT_EQ(full->strata_nvme.nvme_read_bytes, states_only->strata_nvme.nvme_read_bytes);
  EXPECT_EQ(full->like_for_like.strata_least.step_seconds,
            states_only->like_for_like.strata_least.step_seconds);
}

// Adding the activations' traffic to the same states can move the scheduler's choices so that
// the simulated step comes out shorter than without them (a 7B full fine-tune at 4K on a 4090:
// 37.89 s against 39.10 s); the step is at least the one without them plus the copies.
TEST(ActivationOffload, UnderNvmeOffloadTheStepIsAtLeastTheStatesStepPlusTheCopies) {
  PlanRequest r = qlora_8b_at_8k(ActivationOffload::kNvme);
  r.model = *load_model("llama-2-7b");
  r.method = FinetuneMethod::kFull;
  r.seq_len = 4096;
  r.grad_accum = 1;
  r.checkpointing = Checkpointing::kFull;
  r.offload = Offload::kNvme;
  const GpuPlan g = plan_of(r);
  ASSERT_TRUE(g.fits()) << g.why_not;
  ASSERT_GT(g.stages.states_only_step_seconds, 0.0);
  EXPECT_DOUBLE_EQ(g.step_seconds,
                   std::max(g.stages.step_seconds,
                            g.stages.states_only_step_seconds + g.stages.activation_copy_seconds));
  EXPECT_GE(g.step_seconds + 1e-9,
            g.stages.states_only_step_seconds + g.stages.activation_copy_seconds);
  // The states' step is the same job's without activation offload: the same GPU plan here.
  r.activation_offload = ActivationOffload::kNone;
  const GpuPlan alone = plan_of(r);
  ASSERT_EQ(alone.params_resident, g.params_resident);
  EXPECT_EQ(g.stages.states_only_step_seconds, alone.step_seconds);
  EXPECT_GT(g.step_seconds, alone.step_seconds);
}

// Kept in pinned memory under NVMe offload, they take the pool's room beside the drive's figure:
// RAM that cannot hold both does not fit the job (the row says so, instead of a simulation that
// runs out of room); RAM that can is all the pool's, as without them.
TEST(ActivationOffload, KeptInPinnedMemoryUnderNvmeOffloadTheRamGivenMustHoldThemToo) {
  PlanRequest r = qlora_8b_at_8k(ActivationOffload::kPinned);
  r.offload = Offload::kNvme;
  r.host_ram_bytes = uint64_t{32} << 30;
  const GpuPlan short_of_ram = plan_of(r);
  EXPECT_TRUE(short_of_ram.fits_gpu);
  EXPECT_FALSE(short_of_ram.fits_host);
  EXPECT_NE(short_of_ram.why_not.find("host needs"), std::string::npos) << short_of_ram.why_not;
  EXPECT_GE(short_of_ram.stages.pinned_budget_bytes, short_of_ram.activations_offloaded_bytes);

  r.host_ram_bytes = uint64_t{128} << 30;
  const GpuPlan roomy = plan_of(r);
  EXPECT_TRUE(roomy.fits()) << roomy.why_not;
  EXPECT_EQ(roomy.stages.pinned_budget_bytes,
            align_down(usable_host_bytes(*r.host_ram_bytes, r.assume.host_headroom), kPageSize));
}

TEST(ActivationOffload, APlanThatDoesNotFitTheGpuSaysWhatMovingThemWouldGive) {
  PlanRequest r = qlora_8b_at_8k(ActivationOffload::kNone);
  r.offload.reset();  // chosen: NVMe offload, which still does not fit the 4090
  const GpuPlan without = plan_of(r);
  ASSERT_FALSE(without.fits_gpu);
  ASSERT_TRUE(without.with_activation_offload.has_value());
  const ActivationUpgrade& a = *without.with_activation_offload;
  // The plan of the same job with --activation-offload pinned and no offload of the states.
  const GpuPlan moved = plan_of(qlora_8b_at_8k(ActivationOffload::kPinned));
  EXPECT_EQ(a.offload, Offload::kNone);
  EXPECT_EQ(a.gpu_bytes, moved.memory.total());
  EXPECT_EQ(a.host_recommended_bytes, moved.host.recommended_bytes);
  EXPECT_TRUE(a.fits_host);
  EXPECT_DOUBLE_EQ(a.tokens_per_s, moved.tokens_per_s);
  EXPECT_DOUBLE_EQ(a.usd_per_mtok[1], moved.usd_per_mtok[1]);
  // Nothing to say where the GPU fits, where activation offload was asked for, or where the
  // states are to go to NVMe (that would take another simulated step).
  r.seq_len = 1024;
  EXPECT_FALSE(plan_of(r).with_activation_offload.has_value());
  EXPECT_FALSE(plan_of(qlora_8b_at_8k(ActivationOffload::kNvme)).with_activation_offload);
  r = qlora_8b_at_8k(ActivationOffload::kNone);
  r.offload = Offload::kNvme;
  EXPECT_FALSE(plan_of(r).with_activation_offload.has_value());
}

// NAME:auto: the count the suggestion is made at is the smallest where it fits, not the count
// the row ended at when no count fitted without it.
TEST(ActivationOffload, WithAutomaticCountsTheSuggestionIsAtTheSmallestCountThatFits) {
  PlanRequest r = qlora_8b_at_8k(ActivationOffload::kNone);
  r.offload.reset();
  r.gpus = {*parse_gpu_choice("rtx-4090:auto")};
  const GpuPlan row = plan_of(r);
  ASSERT_FALSE(row.fits());
  ASSERT_TRUE(row.with_activation_offload.has_value());
  EXPECT_EQ(row.with_activation_offload->gpu_count, 1u);
  const GpuPlan one = plan_of(qlora_8b_at_8k(ActivationOffload::kPinned));
  EXPECT_EQ(row.with_activation_offload->gpu_bytes, one.memory.total());
  EXPECT_DOUBLE_EQ(row.with_activation_offload->tokens_per_s, one.tokens_per_s);
}

// NAME:auto searches counts with no offload of the states unless --offload is given, so the
// suggestion does too: for 70B full on rtx-4090:auto it named CPU offload at x1, where
// --activation-offload pinned itself gives no offload at x61 (an independent client, 2026-12-05).
TEST(ActivationOffload, WithAutomaticCountsTheSuggestionIsWhatTheFlagGives) {
  PlanRequest r;
  r.model = *load_model("llama-2-70b");
  r.method = FinetuneMethod::kFull;
  r.gpus = {*parse_gpu_choice("rtx-4090:auto")};
  r.nvme = *parse_nvme("1:gen4");
  const GpuPlan row = plan_of(r);
  ASSERT_FALSE(row.fits());
  ASSERT_TRUE(row.with_activation_offload.has_value());
  r.activation_offload = ActivationOffload::kPinned;
  const GpuPlan flagged = plan_of(r);
  ASSERT_TRUE(flagged.fits()) << flagged.why_not;
  const ActivationUpgrade& a = *row.with_activation_offload;
  EXPECT_EQ(a.offload, flagged.offload);
  EXPECT_EQ(a.gpu_count, flagged.choice.count);
  EXPECT_EQ(a.gpu_bytes, flagged.memory.total());
  EXPECT_DOUBLE_EQ(a.tokens_per_s, flagged.tokens_per_s);
}

// With nothing but the activations offloaded, full speed is them in RAM: where they go to NVMe,
// and where they are kept in pinned memory already (the job's host bytes).
TEST(ActivationOffload, FullSpeedKeepsTheOffloadedActivationsInRam) {
  const GpuPlan spilled = plan_of(qlora_8b_at_8k(ActivationOffload::kNvme));
  ASSERT_EQ(spilled.offload, Offload::kNone);
  EXPECT_EQ(spilled.host.full_speed_bytes,
            align_up(spilled.activations_offloaded_bytes, kPageSize));
  const GpuPlan kept = plan_of(qlora_8b_at_8k(ActivationOffload::kPinned));
  ASSERT_EQ(kept.offload, Offload::kNone);
  EXPECT_EQ(kept.host.full_speed_bytes, kept.host_bytes);
  EXPECT_EQ(kept.host.full_speed_bytes, align_up(kept.activations_offloaded_bytes, kPageSize));
}

TEST(ActivationOffload, ParsesItsThreeHomes) {
  EXPECT_EQ(*parse_activation_offload("none"), ActivationOffload::kNone);
  EXPECT_EQ(*parse_activation_offload("Pinned"), ActivationOffload::kPinned);
  EXPECT_EQ(*parse_activation_offload("nvme"), ActivationOffload::kNvme);
  const Result<ActivationOffload> bad = parse_activation_offload("gpu");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("use none, pinned or nvme"), std::string::npos);
}

}  // namespace
}  // namespace strata
