// Runs `strata plan` through its CLI11 definition, as the strata program does.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "model/test_dir.h"

namespace strata {
namespace {

struct CommandRun {
  int code = 0;
  std::string out;
  std::string err;
};

CommandRun run(std::vector<std::string> args) {
  CLI::App app{"strata"};
  app.require_subcommand(1);
  cli::add_plan_command(app);
  args.insert(args.begin(), "strata");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  CommandRun r;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    r.code = e.get_exit_code();
  }
  r.out = ::testing::internal::GetCapturedStdout();
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
}

// One test per method: each 70B plan simulates its advice's re-plans per GPU, so they are the
// slowest tests under the sanitizers, and apart they run in parallel.
class PlanCommandMethod : public ::testing::TestWithParam<const char*> {};

TEST_P(PlanCommandMethod, PrintsJsonForLlama70bOnTheThreeReferenceGpus) {
  const char* method = GetParam();
  CommandRun r = run({"plan", "--model", "llama-2-70b", "--method", method, "--gpu", "h100-sxm",
                      "--gpu", "a100-80gb", "--gpu", "rtx-4090", "--nvme", "4:gen4", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["method"], method);
  EXPECT_EQ(j["gpus"].size(), 3u);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  // Full fine-tuning streams everything; 4-bit QLoRA fits the H100 with nothing to offload.
  if (std::string(method) == "full") {
    EXPECT_GT(j["zero_infinity"]["host_bytes"].get<uint64_t>(), j["host_bytes"].get<uint64_t>());
    EXPECT_EQ(j["like_for_like"]["deepspeed"].size(), 3u);
  } else {
    EXPECT_TRUE(j["zero_infinity"].is_null());  // the labelled configurations are full's
  }
}

INSTANTIATE_TEST_SUITE_P(Methods, PlanCommandMethod, ::testing::Values("full", "lora", "qlora"));

TEST(PlanCommand, PrintsReadableTables) {
  CommandRun r = run({"plan", "--model", "llama-2-70b", "--method", "qlora", "--gpu", "rtx-4090",
                      "--host-ram", "128G"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("strata plan: llama-2-70b, qlora"), std::string::npos) << r.out;
  // The comparison block names DeepSpeed, and says why QLoRA has no DeepSpeed column.
  EXPECT_NE(r.out.find("DeepSpeed ZeRO-3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DeepSpeed: not modelled"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rtx-4090"), std::string::npos);
  EXPECT_NE(r.out.find("Cheapest that fits"), std::string::npos);
}

// "More RAM than this buys nothing; less means NVMe traffic": where NVMe offload was asked for
// and keeping everything in RAM needs no more than the plan's own recommended figure (its staging
// and optimizer pool outweigh the spill), the line says so and names the offload that does it;
// where the GPU holds every state it says there is nothing to keep ("0 B of states" before).
TEST(PlanCommand, TheFullSpeedLineSaysWhenThePlansOwnRamAlreadyCoversIt) {
  CommandRun r = run({"plan", "--model", "llama-3.1-8b", "--method", "qlora", "--gpu", "rtx-4090",
                      "--seq", "8192", "--checkpointing", "none", "--activation-offload", "pinned",
                      "--offload", "nvme"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("recommended 56.19 GiB, no more than this plan's: --offload none keeps "
                       "them in it\n"),
            std::string::npos)
      << r.out;
  r = run({"plan", "--model", "llama-3.1-8b", "--method", "qlora", "--gpu", "rtx-4090", "--offload",
           "nvme"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("full speed     the GPU holds every state: nothing needs RAM or NVMe "
                       "(--offload none)\n"),
            std::string::npos)
      << r.out;
  // Short of full speed, the line is the figure alone.
  r = run({"plan", "--model", "llama-2-7b", "--method", "full", "--gpu", "a100-80gb", "--offload",
           "nvme"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("nothing on NVMe: recommended 104.65 GiB\n"), std::string::npos) << r.out;
}

// The simulated step's figures depend on the steps played before it, so the text says how many
// (from one, NVMe bytes can be about 2% above the steady step's), and how to get the steady one.
TEST(PlanCommand, TheTextNamesTheWarmUpStepsBeforeTheSimulatedStep) {
  CommandRun r = run({"plan", "--model", "llama-2-7b", "--method", "full", "--gpu", "rtx-4090",
                      "--host-ram", "32G"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("the one after\n1 warm-up step; --warmup-steps 2 gives the steady step."),
            std::string::npos)
      << r.out;
  r = run({"plan", "--model", "llama-2-7b", "--method", "full", "--gpu", "rtx-4090", "--host-ram",
           "32G", "--warmup-steps", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("the one after\n2 warm-up steps. \"host\""), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("gives the steady step"), std::string::npos) << r.out;
}

TEST(PlanCommand, BadInputExitsNonZeroWithTheReason) {
  CommandRun r = run({"plan", "--model", "llama-9-1t"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("llama-2-70b"), std::string::npos) << r.err;  // lists the presets
  r = run({"plan", "--model", "llama-2-7b", "--nvme", "3:gen9"});
  EXPECT_EQ(r.code, 2);
  r = run({"plan", "--model", "llama-2-7b", "--host-ram", "lots"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--host-ram"), std::string::npos);
  r = run({"plan"});  // --model is required
  EXPECT_NE(r.code, 0);
}

// Input a plan would otherwise drop or misread without a word (an independent client's findings,
// 2026-12-05): each is refused, exit 2, naming the flag and what it is for (empty values:
// FlagErrors).
TEST(PlanCommand, InputThatWouldBeIgnoredOrMisreadIsRefused) {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{"--method", "full", "--lora-rank", "8"}, "--method full trains every weight"},
      {{"--lora-targets", "q,v"}, "apply to --method lora and qlora"},  // full is the default
      {{"--gpu", "h100-sxm", "--gpu", "h100-sxm:1"}, "--gpu h100-sxm:1 is given twice"},
      {{"--scale", "2"}, "--scale narrows the model"},  // was: DeepSpeed's knob factor
      {{"--layers", "200"}, "of llama-2-70b's 80 layers: 1..80, not 200"},
      {{"--layers", "0"}, "of llama-2-70b's 80 layers: 1..80, not 0"},
      {{"--scale", "0"}, "it must be in (0, 1], not 0.000"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"plan", "--model", "llama-2-70b"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CommandRun r = run(args);
    EXPECT_EQ(r.code, 2) << c.says << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
  }
  // LoRA options with LoRA, and a narrower, shallower model, are plans as before.
  EXPECT_EQ(run({"plan", "--model", "llama-2-7b", "--method", "lora", "--lora-rank", "8", "--gpu",
                 "a100-80gb"})
                .code,
            0);
  EXPECT_EQ(run({"plan", "--model", "llama-2-7b", "--scale", "0.5", "--layers", "32", "--gpu",
                 "a100-80gb"})
                .code,
            0);
  // A drive named alone is one such drive at its generation's rates (a Gen5 drive had Gen4's);
  // with --nvme, the rates are --nvme's.
  const auto rates = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"plan",     "--model",   "tinyllama-1.1b", "--gpu",
                                     "rtx-4090", "--offload", "nvme",           "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandRun r = run(args);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    return std::pair(j["nvme"]["label"].get<std::string>(), j["nvme"]["read_gbps"].get<double>());
  };
  EXPECT_EQ(rates({"--nvme-drive", "crucial-t705-4tb"}),
            std::pair(std::string("1 x gen5-x4"), 13.0));
  EXPECT_EQ(rates({"--nvme-drive", "crucial-t705-4tb", "--nvme", "1:gen4"}),
            std::pair(std::string("1 x gen4-x4"), 7.0));
  // One GPU at two counts compares them: two rows, a plan.
  EXPECT_EQ(
      run({"plan", "--model", "llama-2-7b", "--gpu", "a100-80gb:1", "--gpu", "a100-80gb:2"}).code,
      0);
}

TEST(PlanCommand, JobTokensPriceTheFittingRowsAndNothingFittingExitsNonZero) {
  CommandRun r = run({"plan", "--model", "llama-2-13b", "--method", "lora", "--offload", "none",
                      "--gpu", "a100-80gb", "--gpu", "rtx-4090", "--tokens", "68000000"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("job            68,000,000 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not fit: rtx-4090: GPU needs"), std::string::npos) << r.out;
  r = run({"plan", "--model", "llama-2-13b", "--method", "lora", "--offload", "none", "--gpu",
           "a100-80gb", "--gpu", "rtx-4090", "--tokens", "68000000", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["gpus"][1]["usd_per_mtok_typical"].is_null());
  EXPECT_TRUE(j["gpus"][1]["job"].is_null());
  EXPECT_GT(j["gpus"][0]["job"]["hours"].get<double>(), 0);
  EXPECT_EQ(j["job"]["steps"], 68000000 / 4096 + 1);
  r = run({"plan", "--model", "llama-2-13b", "--method", "lora", "--offload", "none", "--gpu",
           "rtx-4090"});
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.err.find("fits none"), std::string::npos) << r.err;
  r = run({"plan", "--model", "llama-2-7b", "--tokens", "1e6", "--epochs", "2"});
  EXPECT_EQ(r.code, 2);
  // A count of tokens is whole and at most 1e18: half a token printed "0 tokens = 1 steps",
  // and 2e19 (past 2^64) "0 tokens". A fraction of an epoch is fine, its tokens rounded up.
  for (const char* tokens : {"0.5", "2e19", "1e300", "1000.5"}) {
    r = run({"plan", "--model", "llama-2-7b", "--method", "lora", "--gpu", "a100-80gb", "--tokens",
             tokens});
    EXPECT_EQ(r.code, 2) << tokens;
    EXPECT_NE(r.err.find("--tokens must be a whole count from 1 to 1e18"), std::string::npos)
        << r.err;
  }
  r = run({"plan", "--model", "llama-2-7b", "--method", "lora", "--gpu", "a100-80gb", "--epochs",
           "1.5", "--dataset-tokens", "1000.5"});
  EXPECT_EQ(r.code, 2);
  r = run({"plan", "--model", "llama-2-7b", "--method", "lora", "--gpu", "a100-80gb", "--epochs",
           "1.5", "--dataset-tokens", "1001"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("job            1,502 tokens = 1 step: "), std::string::npos) << r.out;
}

TEST(PlanCommand, ScaledModelScalesDeepSpeedsKnobsAsTheBenchmarkDoes) {
  // The main job's shape: llama-2-70b at a quarter of the width, 6 layers.
  CommandRun r = run({"plan", "--model", "llama-2-70b", "--scale", "0.25", "--layers", "6", "--gpu",
                      "h100-sxm", "--offload", "nvme", "--seq", "512", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const double factor = 353'658'880.0 / 68'976'648'192.0;  // scaled / full parameters
  EXPECT_NEAR(j["like_for_like"]["deepspeed_knob_factor"].get<double>(), factor, 1e-12);
  ASSERT_EQ(j["like_for_like"]["deepspeed"].size(), 3u);
  const auto& defaults = j["like_for_like"]["deepspeed"][0];
  EXPECT_EQ(defaults["name"], "deepspeed-defaults");
  // max_in_cpu (1e9) scaled: its flat bf16 buffer holds 1e9 x factor elements, not the model.
  bool found = false;
  for (const auto& b : defaults["buffers"]) {
    if (b["name"] != "max_in_cpu flat parameter buffer") continue;
    found = true;
    EXPECT_EQ(b["bytes_each"].get<uint64_t>(),
              2 * static_cast<uint64_t>(std::llround(1e9 * factor)));
  }
  EXPECT_TRUE(found);
}

TEST(PlanCommand, JsonCarriesHeadroomAttentionWearAdviceAndTheComparison) {
  CommandRun r = run({"plan", "--model", "tinyllama-1.1b", "--gpu", "rtx-4090", "--offload", "nvme",
                      "--tokens", "1e8", "--nvme-tbw", "600", "--attention", "eager", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"host", "with_more_ram", "attention", "attention_flops_per_token", "job",
                          "nvme_wear", "advice", "like_for_like", "fits_anywhere"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["attention"], "eager");
  EXPECT_GT(j["host"]["recommended_bytes"].get<uint64_t>(), j["host"]["job_bytes"].get<uint64_t>());
  EXPECT_EQ(j["nvme"]["tbw_tb_per_drive"], 600.0);
  EXPECT_GT(j["nvme_wear"]["tb_written_per_job"].get<double>(), 0);
  EXPECT_TRUE(j["like_for_like"].contains("step_time_ratio_equal_ram"));
  ASSERT_EQ(j["like_for_like"]["deepspeed"].size(), 3u);
  for (const auto& d : j["like_for_like"]["deepspeed"]) {
    for (const char* key :
         {"name", "deepspeed_knob_factor", "host_bytes", "host_bytes_steps", "host_moment",
          "pinned_bytes", "step_seconds", "nvme_read_bytes_per_step", "nvme_write_bytes_per_step",
          "nvme_io_per_step", "buffers", "fits_host", "strata_equal_ram",
          "host_ratio_each_side_least", "step_time_ratio_each_side_least",
          "step_time_ratio_equal_ram"}) {
      EXPECT_TRUE(d.contains(key)) << key;
    }
    EXPECT_EQ(d["deepspeed_knob_factor"], 1.0);  // a full-size model: DeepSpeed's own knobs
  }
  EXPECT_EQ(j["like_for_like"]["deepspeed_estimator"]["function"],
            "estimate_zero3_model_states_mem_needs");
  r = run({"plan", "--model", "tinyllama-1.1b", "--attention", "sparse"});
  EXPECT_EQ(r.code, 2);
  r = run({"plan", "--model", "tinyllama-1.1b", "--nvme-drive", "floppy"});
  EXPECT_EQ(r.code, 2);
}

TEST(PlanCommand, ScaleAndLayersPlanTheShapeBenchFinetuneRuns) {
  // The main job's model: llama-2-70b at a quarter of its width, 6 layers, 354M parameters.
  CommandRun r = run({"plan", "--model", "llama-2-70b", "--scale", "0.25", "--layers", "6", "--gpu",
                      "h100-sxm", "--offload", "none", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["params"], 353'658'880u);
  r = run({"plan", "--model", "llama-2-70b", "--scale", "0", "--gpu", "h100-sxm"});
  EXPECT_EQ(r.code, 2);
}

// --trace writes the simulated steps of the plan's NVMe offload as a Chrome trace: each transfer
// named by its tensor, with its bytes, on the runtime's tracks; the phases' compute and waits.
// The measured step's NVMe bytes are those the plan reports (its last step, from the last phase
// of the step before ends).
TEST(PlanCommand, TraceWritesTheSimulatedStepsTransfersNamedByTensor) {
  const std::filesystem::path dir = testing::scratch_dir("plan-trace");
  const std::string path = (dir / "plan.json").string();
  const std::vector<std::string> shape = {
      "plan",     "--model",   "llama-2-7b", "--scale",         "0.1", "--layers",
      "2",        "--seq",     "256",        "--batch",         "1",   "--gpu",
      "h100-sxm", "--offload", "nvme",       "--pinned-budget", "64M", "--host-reserve",
      "0",        "--json"};
  std::vector<std::string> args = shape;
  args.insert(args.end(), {"--trace", path});
  CommandRun r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("events of 2 simulated steps"), std::string::npos) << r.err;
  const nlohmann::json plan = nlohmann::json::parse(r.out);
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  const nlohmann::json& events = trace.is_array() ? trace : trace["traceEvents"];
  std::map<std::string, uint64_t> bytes_by_track;
  std::map<std::string, int> spans_by_track;
  bool named_state = false, inventory_name = false;
  for (const nlohmann::json& e : events) {
    if (e.value("ph", "") != "X") continue;
    const std::string track = e.value("cat", "");
    ++spans_by_track[track];
    if (e.contains("args") && e["args"].contains("bytes")) {
      bytes_by_track[track] += e["args"]["bytes"].get<uint64_t>();
    }
    // Under the names the runtime's optimizer gives them ("w.exp_avg[0]"), as in a run's trace.
    const std::string name = e.value("name", "");
    named_state = named_state || name.find(".exp_avg[") != std::string::npos;
    inventory_name = inventory_name || name.find("#adam") != std::string::npos ||
                     name.find("#master") != std::string::npos;
  }
  EXPECT_TRUE(named_state) << "the optimizer's states are named";
  EXPECT_FALSE(inventory_name) << "a state under the planner inventory's name";
  EXPECT_GT(spans_by_track["compute"], 0);
  EXPECT_GT(spans_by_track["optimizer"], 0);
  // Two steps (one warm-up): at least the measured step's bytes, at most twice and a bit.
  const uint64_t read = plan["strata_nvme"]["nvme_read_bytes_per_step"].get<uint64_t>();
  const uint64_t written = plan["strata_nvme"]["nvme_write_bytes_per_step"].get<uint64_t>();
  EXPECT_GE(bytes_by_track["nvme read"], read);
  EXPECT_LE(bytes_by_track["nvme read"], 3 * read);
  EXPECT_GE(bytes_by_track["nvme write"], written);
  EXPECT_LE(bytes_by_track["nvme write"], 3 * written);

  // Tracing changes nothing in the plan.
  CommandRun plain = run(shape);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out, r.out);
  // A path that cannot be written fails before the plan is made: nothing on stdout.
  for (const std::string& bad : {(dir / "missing" / "plan.json").string(), dir.string()}) {
    args.back() = bad;
    r = run(args);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find("--trace " + bad), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
