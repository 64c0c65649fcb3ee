// Checkpoints and resume: N steps + resume + N steps gives exactly the losses and weights of 2N
// uninterrupted steps (dropout on, so the RNG state must come back too); rotation, the `latest`
// pointer, crash-safety of saves, and errors for damaged checkpoints.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/core/error.h"
#include "src/core/recipe.h"
#include "src/engine/checkpoint.h"
#include "src/engine/trainer.h"
#include "src/io/atomic_dir.h"
#include "src/io/safetensors.h"
#include "src/nn/kernel_choice.h"
#include "tests/support/test_support.h"

namespace fs = std::filesystem;
using namespace colossal;
using colossal::test::TempDir;

namespace {

// Bit-identical is a CPU claim (test_cuda covers GPUs).
Recipe tiny_recipe(const std::string& out, int64_t max_steps, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), "train.device=cpu");
  return colossal::test::tiny_training_recipe(out, max_steps, extra);
}

}  // namespace

TEST(Resume, NStepsPlusResumePlusNStepsEqualsTwoNStepsExactly) {
  TempDir a, b;
  // Runs a and b each time their own kernel choices, and a close call may go either way, so both are
  // pinned here; that a resumed run keeps its original run's timed choices is tested below.
  const std::vector<std::string> pinned = {"kernels.attention=fused", "kernels.gelu=fused", "kernels.gemv=fused",
                                           "kernels.layer_norm=fused", "kernels.gemm=fused"};
  ASSERT_EQ(run_training(tiny_recipe(a.path(), 12, pinned), {.quiet = true}), 0);
  ASSERT_EQ(run_training(tiny_recipe(b.path(), 6, pinned), {.quiet = true}), 0);
  ASSERT_EQ(run_training(tiny_recipe(b.path(), 12, pinned), {.resume = true, .quiet = true}), 0);

  auto la = colossal::test::metric_values(a / "metrics.jsonl", "loss");
  auto lb = colossal::test::metric_values(b / "metrics.jsonl", "loss");
  ASSERT_EQ(la.size(), 12u);
  ASSERT_EQ(lb.size(), 12u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;   // bit-identical

  auto wa = load_safetensors(a / "checkpoints/step-000012/model.safetensors");
  auto wb = load_safetensors(b / "checkpoints/step-000012/model.safetensors");
  ASSERT_EQ(wa.tensors.size(), wb.tensors.size());
  for (size_t i = 0; i < wa.tensors.size(); ++i) EXPECT_TRUE(at::equal(wa.tensors[i].tensor, wb.tensors[i].tensor)) << wa.tensors[i].name;
}

TEST(Resume, EveryOptimizerResumesBitIdenticallyAndAnotherIsRefused) {
  for (const char* name : {"lamb", "lars", "lion", "sgd"}) {
    TempDir a, b;
    const std::vector<std::string> set = {"kernels.attention=fused", "kernels.gelu=fused", "kernels.gemv=fused", "kernels.layer_norm=fused",
                                          "kernels.gemm=fused", std::string("optim.name=") + name, "optim.lr=1e-3"};
    ASSERT_EQ(run_training(tiny_recipe(a.path(), 6, set), {.quiet = true}), 0) << name;
    ASSERT_EQ(run_training(tiny_recipe(b.path(), 3, set), {.quiet = true}), 0) << name;
    ASSERT_EQ(run_training(tiny_recipe(b.path(), 6, set), {.resume = true, .quiet = true}), 0) << name;
    auto la = colossal::test::metric_values(a / "metrics.jsonl", "loss");
    auto lb = colossal::test::metric_values(b / "metrics.jsonl", "loss");
    ASSERT_EQ(lb.size(), 6u) << name;
    for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << name << " step " << i + 1;
    EXPECT_LT(la.back(), la.front()) << name << " learns";
    auto other = set;
    other.back() = std::string("optim.name=") + (std::string(name) == "sgd" ? "lion" : "sgd");
    std::string e;
    try {
      run_training(tiny_recipe(b.path(), 9, other), {.resume = true, .quiet = true});
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_NE(e.find(std::string("holds ") + name + " state, but this run uses"), std::string::npos) << e;
  }
}

TEST(Checkpoint, KeepsTheLastNAndPointsLatestAtTheNewest) {
  TempDir a;
  ASSERT_EQ(run_training(tiny_recipe(a.path(), 9), {.quiet = true}), 0);
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(a / "checkpoints")) steps.push_back(e.path().filename().string());
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<std::string>{"latest", "step-000006", "step-000009"}));
  EXPECT_EQ(resolve_checkpoint(a.path()), a / "checkpoints/step-000009");
  EXPECT_EQ(resolve_checkpoint(a / "checkpoints"), a / "checkpoints/step-000009");
  auto info = read_checkpoint_info(resolve_checkpoint(a.path()));
  EXPECT_EQ(info.state.step, 9);
  EXPECT_EQ(info.model.n_embd, 32);
  EXPECT_EQ(info.config["model_type"], "gpt2");
  EXPECT_TRUE(fs::exists(a / "summary.json"));
}

TEST(Checkpoint, AnUncommittedSaveLeavesTheLastCompleteOneAndNoDebris) {
  TempDir d;
  fs::create_directories(d / "ckpt/step-000001");
  colossal::test::write_file(d / "ckpt/step-000001/model.safetensors", "x");
  write_file_atomic(d / "ckpt/latest", "step-000001\n");
  {
    AtomicDir half(d / "ckpt/step-000002");   // a save that dies before commit()
    colossal::test::write_file(half.path() + "/model.safetensors", "partial");
  }
  EXPECT_EQ(resolve_checkpoint(d / "ckpt"), d / "ckpt/step-000001");
  EXPECT_FALSE(fs::exists(d / "ckpt/step-000002"));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d / "ckpt")) ++entries;
  EXPECT_EQ(entries, 2);
}

TEST(Checkpoint, ResumeWithoutACheckpointIsAClearError) {
  TempDir a;
  try {
    run_training(tiny_recipe(a.path(), 3), {.resume = true, .quiet = true});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such file or directory"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, CorruptWeightsAreRejectedOnResume) {
  TempDir a;
  ASSERT_EQ(run_training(tiny_recipe(a.path(), 3), {.quiet = true}), 0);
  const std::string model = a / "checkpoints/step-000003/model.safetensors";
  std::string bytes = colossal::test::read_file(model);
  colossal::test::write_file(model, bytes.substr(0, bytes.size() / 2));
  try {
    run_training(tiny_recipe(a.path(), 6), {.resume = true, .quiet = true});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lies outside the file"), std::string::npos) << e.what();
  }
}

TEST(Finetune, StartsFromTheCheckpointWeightsAtStepZero) {
  TempDir base, ft;
  ASSERT_EQ(run_training(tiny_recipe(base.path(), 6), {.quiet = true}), 0);
  auto r = tiny_recipe(ft.path(), 2, {"finetune.from=" + base.path(), "optim.lr=1e-9", "optim.min_lr=0",
                                      "model.dropout=0.0"});
  ASSERT_EQ(run_training(r, {.finetune = true, .quiet = true}), 0);
  // With a vanishing learning rate the finetuned weights are the base weights.
  auto wb = load_safetensors(base / "checkpoints/step-000006/model.safetensors");
  auto wf = load_safetensors(ft / "checkpoints/step-000002/model.safetensors");
  for (size_t i = 0; i < wb.tensors.size(); ++i)
    EXPECT_TRUE(at::allclose(wb.tensors[i].tensor, wf.tensors[i].tensor, 0, 1e-6)) << wb.tensors[i].name;
}

TEST(Finetune, ADifferentShapeInTheRecipeIsAnError) {
  TempDir base, ft;
  ASSERT_EQ(run_training(tiny_recipe(base.path(), 3), {.quiet = true}), 0);
  auto r = tiny_recipe(ft.path(), 2, {"finetune.from=" + base.path(), "model.n_layer=3"});
  try {
    run_training(r, {.finetune = true, .quiet = true});
    FAIL();
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("--set model.n_layer: = 3 but checkpoint"), std::string::npos) << e.what();
  }
}

TEST(Resume, KernelChoicesTravelInTheCheckpointAndAreNotTimedAgain) {
  TempDir d;
  // Dropout off, so the fused attention applies and is timed against ATen at its first call.
  ASSERT_EQ(run_training(tiny_recipe(d.path(), 6, {"model.dropout=0"}), {.quiet = true}), 0);
  const std::string state_path = d / "checkpoints/step-000006/trainer_state.json";
  auto state = nlohmann::json::parse(colossal::test::read_file(state_path));
  ASSERT_TRUE(state["kernel_choices"].is_object()) << state.dump();
  const std::string key = "attention B=4 T=32 H=2 D=16 fwd+bwd";
  ASSERT_TRUE(state["kernel_choices"].contains(key)) << state.dump();
  // Flip the saved choice: a resumed run must use it as saved, not time the kernels again.
  const std::string flipped = state["kernel_choices"][key] == "fused" ? "aten" : "fused";
  state["kernel_choices"][key] = flipped;
  colossal::test::write_file(state_path, state.dump());
  ASSERT_EQ(run_training(tiny_recipe(d.path(), 8, {"model.dropout=0"}), {.resume = true, .quiet = true}), 0);
  EXPECT_EQ(nn::kernel_choices().at(key), flipped);
  auto resumed = nlohmann::json::parse(colossal::test::read_file(d / "checkpoints/step-000008/trainer_state.json"));
  EXPECT_EQ(resumed["kernel_choices"][key], flipped);
  // A damaged entry is a clear error, not a silent re-time.
  state["kernel_choices"][key] = "fast";
  colossal::test::write_file(state_path, state.dump());
  try {
    read_checkpoint_info(d / "checkpoints/step-000006");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel_choices[\"" + key + "\"] must be \"fused\" or \"aten\""), std::string::npos)
        << e.what();
  }
}

namespace {

std::string resume_error(const TempDir& d, int64_t to_step) {
  try {
    run_training(tiny_recipe(d.path(), to_step), {.resume = true, .quiet = true});
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Resume, TrainerStateIsCheckedBeforeItIsTrusted) {
  TempDir d;
  ASSERT_EQ(run_training(tiny_recipe(d.path(), 3), {.quiet = true}), 0);
  const std::string ckpt = d / "checkpoints/step-000003";
  const std::string path = ckpt + "/trainer_state.json";
  const auto good = nlohmann::json::parse(colossal::test::read_file(path));
  // The error reading the checkpoint gives with `text` as its trainer_state.json.
  auto error_for = [&](const std::string& text) {
    colossal::test::write_file(path, text);
    try {
      read_checkpoint_info(ckpt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto error_with = [&](const char* key, const nlohmann::json& value) {
    auto s = good;
    s[key] = value;
    return error_for(s.dump());
  };
  EXPECT_NE(error_with("step", -5).find("\"step\" = -5 (expected a whole number >= 0)"), std::string::npos) << error_with("step", -5);
  EXPECT_NE(error_with("step", 1e30).find("\"step\" = 1e+30"), std::string::npos) << error_with("step", 1e30);
  EXPECT_NE(error_with("step", "5").find("\"step\" = \"5\""), std::string::npos);
  EXPECT_NE(error_with("samples_seen", 2.5).find("\"samples_seen\" = 2.5"), std::string::npos);
  {   // checkpoints from before data parallelism counted batches as loader_position
    auto legacy = good;
    legacy.erase("samples_seen");
    legacy["loader_position"] = 2.5;
    const std::string e = error_for(legacy.dump());
    EXPECT_NE(e.find("\"loader_position\" = 2.5"), std::string::npos) << e;
    legacy["loader_position"] = 6;
    EXPECT_EQ(error_for(legacy.dump()), "(no error)");
    // Batches of one process become samples on resume: a count that overflows them is refused there.
    legacy["loader_position"] = int64_t{1} << 62;
    colossal::test::write_file(path, legacy.dump());
    const std::string overflow = resume_error(d, 6);
    EXPECT_NE(overflow.find("trainer_state.json: loader_position = 4611686018427387904 batches of"), std::string::npos) << overflow;
    EXPECT_NE(overflow.find("overflow the sample count"), std::string::npos) << overflow;
  }
  EXPECT_NE(error_with("train_loss", "low").find("\"train_loss\" = \"low\" (expected a number)"), std::string::npos);
  EXPECT_EQ(error_with("train_loss", nullptr), "(no error)");   // a NaN loss is stored as null
  for (const auto& [text, message] : {std::pair<std::string, std::string>{"[1, 2]", "trainer_state.json holds array, not a JSON object"},
                                      {"{\"step\": 1e999}", "is not valid JSON (a number out of range)"},
                                      {"{\"step\": 3,", "is not valid JSON (syntax error at byte"}}) {
    const std::string e = error_for(text);
    EXPECT_NE(e.find(message), std::string::npos) << text << ": " << e;
  }
  // Without trainer_state.json there is nothing to resume (a silent restart at step 0 is not a resume).
  fs::remove(path);
  EXPECT_NE(resume_error(d, 6).find("trainer_state.json is missing"), std::string::npos) << resume_error(d, 6);
}

TEST(Resume, TheRandomGeneratorStateIsRequiredAndItsSizeChecked) {
  TempDir d;
  ASSERT_EQ(run_training(tiny_recipe(d.path(), 3), {.quiet = true}), 0);
  const std::string opt = d / "checkpoints/step-000003/optimizer.safetensors";
  auto file = load_safetensors(opt);
  auto rewrite = [&](bool drop_rng, int64_t rng_bytes) {
    std::vector<NamedTensor> kept;
    for (const auto& t : file.tensors) {
      if (t.name != "__rng_cpu__") kept.push_back(t);
      else if (!drop_rng) kept.push_back({t.name, at::zeros({rng_bytes}, at::kByte)});
    }
    save_safetensors(opt, kept, file.metadata);
  };
  rewrite(true, 0);
  EXPECT_NE(resume_error(d, 6).find("\"__rng_cpu__\" (the random generator's state) is missing"), std::string::npos)
      << resume_error(d, 6);
  rewrite(false, 7);
  EXPECT_NE(resume_error(d, 6).find("\"__rng_cpu__\" holds 7 Byte values, expected"), std::string::npos) << resume_error(d, 6);
  auto meta = file.metadata;
  file.metadata["step"] = "-3";
  rewrite(false, file.at("__rng_cpu__", opt).numel());
  EXPECT_NE(resume_error(d, 6).find("metadata step = \"-3\" (expected a whole number >= 0)"), std::string::npos)
      << resume_error(d, 6);
  file.metadata = meta;
}
