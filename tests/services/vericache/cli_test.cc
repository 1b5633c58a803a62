// Runs the real `vericache` binary and checks the CLI contract: exit codes,
// one-line errors, the JSON object, and that threads/SIMD never change tokens.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/services/vericache/cli_runner.h"

namespace {

using vc::testing_cli::CountLines;
using vc::testing_cli::RunCli;
using vc::testing_cli::RunResult;

std::string ModelsDir() {
  const char* d = std::getenv("VC_MODELS_DIR");
  return d ? d : "";
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ModelsDir();
    if (dir_.empty() || !std::ifstream(dir_ + "/stories260K.bin").good()) {
      GTEST_SKIP() << "test models not found (VC_MODELS_DIR)";
    }
    stories_ = dir_ + "/stories260K.bin";
    aidreams_ = dir_ + "/aidreams260K.bin";
    tok_ = dir_ + "/aidreams260K.tok512.bin";
  }
  // Why `--backend cuda` cannot run here (no GPU, or a build without CUDA),
  // or "" when it can; any other failure of the probe fails the test.
  std::string CudaUnavailable() {
    RunResult probe = RunCli("generate --model " + stories_ +
                             " --prompt-ids '1 306' --max-new-tokens 1 --backend cuda --json");
    if (probe.exit_code == 2 && (probe.err.find("no CUDA device") != std::string::npos ||
                                 probe.err.find("unknown kernel backend") != std::string::npos)) {
      return probe.err;
    }
    EXPECT_EQ(probe.exit_code, 0) << probe.err;
    return "";
  }
  std::string dir_, stories_, aidreams_, tok_;
};

TEST_F(CliTest, JsonContract) {
  RunResult r = RunCli("generate --model " + stories_ +
                    " --prompt-ids '1 306 461' --max-new-tokens 20 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mode"], "full");
  EXPECT_EQ(j["prompt_tokens"], 3);
  EXPECT_EQ(j["tokens"].size(), 20u);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  // Decode time counts from the end of the prompt's prefill, in every mode.
  EXPECT_GT(j["prefill_seconds"].get<double>(), 0.0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_LE(j["prefill_seconds"].get<double>() + j["decode_seconds"].get<double>(),
            j["seconds"].get<double>() * 1.01 + 1e-3);
  EXPECT_EQ(j["mean_accepted"], 0.0);
  EXPECT_EQ(j["draft_weights"], "f32");
  EXPECT_EQ(CountLines(r.out), 1);
}

TEST_F(CliTest, QuantisedDrafterWeightsNeverChangeTokens) {
  for (const std::string& model : {stories_, aidreams_}) {
    const std::string base = "generate --model " + model +
                             " --prompt-ids \"$(yes '1 306 461 260' | head -n 12 | tr '\\n' ' ')\""
                             " --max-new-tokens 72 --ignore-eos --json";  // aidreams: context 128
    const auto full = nlohmann::json::parse(RunCli(base).out);
    for (const std::string weights : {"int8", "int4"}) {
      for (const std::string sampling : {"", " --temperature 0.8 --seed 3"}) {
        const std::string extra =
            " --mode vericache --compressor int8 --draft-len 8 --draft-weights " + weights + sampling;
        RunResult r = RunCli(base + extra);
        ASSERT_EQ(r.exit_code, 0) << extra << r.err;
        const auto j = nlohmann::json::parse(r.out);
        const auto ref = sampling.empty() ? full : nlohmann::json::parse(RunCli(base + sampling).out);
        EXPECT_EQ(j["tokens"], ref["tokens"]) << model << extra;
        EXPECT_EQ(j["draft_weights"], weights);
        EXPECT_GT(j["verify_rounds"].get<int>(), 0);
        EXPECT_GE(j["mean_accepted"].get<double>(), 0.0);
      }
    }
  }
}

// A separate draft model (aidreams260K drafting for stories260K: both
// llama2.c with 512 ids) never changes tokens, greedy or seeded, with f32 or
// quantised draft weights; the JSON names it and reports KV refresh off.
TEST_F(CliTest, DraftModelNeverChangesTokens) {
  const std::string base = "generate --model " + stories_ +
                           " --prompt-ids \"$(yes '1 306 461 260' | head -n 12 | tr '\\n' ' ')\""
                           " --max-new-tokens 40 --ignore-eos --json";
  for (const std::string sampling : {"", " --temperature 0.8 --seed 3"}) {
    const auto ref = nlohmann::json::parse(RunCli(base + sampling).out);
    ASSERT_EQ(ref["draft_model"], nullptr);
    for (const std::string weights : {"f32", "int8"}) {
      const std::string extra = " --mode vericache --compressor snapkv --ratio 0.5 --draft-model " +
                                aidreams_ + " --draft-weights " + weights + sampling;
      RunResult r = RunCli(base + extra);
      ASSERT_EQ(r.exit_code, 0) << extra << r.err;
      const auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["tokens"], ref["tokens"]) << extra;
      EXPECT_EQ(j["draft_model"], aidreams_);
      EXPECT_EQ(j["draft_weights"], weights);
      EXPECT_EQ(j["kv_refresh"], false);
      EXPECT_GT(j["verify_rounds"].get<int>(), 0);
    }
    // Without --compressor the draft model keeps its exact KV.
    RunResult r = RunCli(base + " --mode vericache --draft-model " + aidreams_ + sampling);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"], ref["tokens"]) << sampling;
    EXPECT_EQ(j["compressor"], "none");
    EXPECT_EQ(j["compression_ratio"], 1.0);
  }
}

// Refusals: one line on stderr, exit code 2, before any token comes out.
TEST_F(CliTest, DraftModelRefusals) {
  const std::string base =
      "generate --model " + stories_ + " --prompt-ids '1 2 3' --max-new-tokens 5";
  const std::string hf = dir_ + "/tinystories656K";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --mode vericache --draft-model " + hf, "vocabulary of 2048 tokens"},
      {" --mode vericache --draft-model /nonexistent/draft.bin", "--draft-model"},
      {" --draft-model " + aidreams_, "--draft-model applies to --mode vericache"},
      {" --mode lossy --draft-model " + aidreams_, "--draft-model applies to --mode vericache"},
      {" --mode vericache --ratio 0.5 --draft-model " + aidreams_, "--ratio needs --compressor"},
  };
  for (const auto& [extra, needle] : cases) {
    RunResult r = RunCli(base + extra);
    EXPECT_EQ(r.exit_code, 2) << extra << "\n" << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << extra << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << extra << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << extra;
  }
}

// Hugging Face checkpoints match only with identical tokenizer.json files: a
// copy of tinystories656K drafts for it (exactly), and the same copy with
// one byte more in its tokenizer.json is refused.
TEST_F(CliTest, DraftModelHuggingFaceTokenizersMustBeIdentical) {
  namespace fs = std::filesystem;
  const fs::path hf = dir_ + "/tinystories656K";
  if (!fs::exists(hf / "tokenizer.json")) GTEST_SKIP() << "tinystories656K not found";
  const fs::path copy = fs::path(::testing::TempDir()) / ("draft_hf_" + std::to_string(getpid()));
  fs::remove_all(copy);
  fs::create_directories(copy);
  for (const auto& e : fs::directory_iterator(hf))
    fs::copy_file(e.path(), copy / e.path().filename());
  fs::permissions(copy / "tokenizer.json", fs::perms::owner_write, fs::perm_options::add);
  const std::string base =
      "generate --model " + hf.string() +
      " --prompt-ids '1 306 461 260 300' --max-new-tokens 30 --ignore-eos --json";
  const auto ref = nlohmann::json::parse(RunCli(base).out);
  RunResult same = RunCli(base + " --mode vericache --draft-model " + copy.string());
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(nlohmann::json::parse(same.out)["tokens"], ref["tokens"]);
  std::ofstream(copy / "tokenizer.json", std::ios::app) << " ";
  RunResult differs = RunCli(base + " --mode vericache --draft-model " + copy.string());
  EXPECT_EQ(differs.exit_code, 2) << differs.err;
  EXPECT_EQ(CountLines(differs.err), 1) << differs.err;
  EXPECT_NE(differs.err.find("tokenizer.json differs"), std::string::npos) << differs.err;
  fs::remove_all(copy);
}

TEST_F(CliTest, ThreadsAndSimdNeverChangeTokens) {
  const std::string base = "generate --model " + stories_ +
                           " --prompt-ids '1 306 461 260 ' --max-new-tokens 200 --ignore-eos --json";
  RunResult ref = RunCli(base + " --threads 1 --simd scalar");
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const auto tokens = nlohmann::json::parse(ref.out)["tokens"];
  for (const char* extra : {" --threads 2", " --threads 4", " --threads 3 --simd avx2",
                            " --threads 2 --simd auto"}) {
    RunResult r = RunCli(base + extra);
    if (r.exit_code == 2 && r.err.find("not supported by this CPU") != std::string::npos) continue;
    ASSERT_EQ(r.exit_code, 0) << extra << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"], tokens) << extra;
  }
}

// The CUDA backend gives the CPU's tokens (docs/numerics.md, "The CUDA
// backend"), in full and VeriCache mode, greedy and seeded, on all three
// test models. Skips where no GPU (or no CUDA build) is there; ran on an
// H200 (docs/results.md section 9).
TEST_F(CliTest, CudaBackendNeverChangesTokens) {
  if (const std::string why = CudaUnavailable(); !why.empty()) GTEST_SKIP() << why;
  if (HasFailure()) return;
  const std::string tiny = dir_ + "/tinystories656K";
  for (const std::string& prompt :
       {"--model " + stories_ + " --prompt-ids '1 306 461' --max-new-tokens 64",
        "--model " + aidreams_ + " --prompt-ids '1 306 461' --max-new-tokens 48",
        "--model " + tiny + " --prompt 'Once upon a time' --max-new-tokens 64"}) {
    for (const std::string& mode :
         {std::string("--mode full"), std::string("--mode vericache --compressor int8"),
          std::string("--mode full --temperature 0.8 --seed 7"),
          std::string("--mode vericache --compressor kivi --bits 2 --temperature 0.8 --seed 7")}) {
      std::string base = "generate " + prompt;
      base += " " + mode + " --ignore-eos --json";
      RunResult cpu = RunCli(base + " --backend cpu");
      RunResult cuda = RunCli(base + " --backend cuda");
      ASSERT_EQ(cpu.exit_code, 0) << base << ": " << cpu.err;
      ASSERT_EQ(cuda.exit_code, 0) << base << ": " << cuda.err;
      const auto want = nlohmann::json::parse(cpu.out), got = nlohmann::json::parse(cuda.out);
      EXPECT_EQ(got["tokens"], want["tokens"]) << base;
      EXPECT_EQ(got["backend"].get<std::string>().rfind("cuda/", 0), 0u) << got["backend"];
    }
  }
  // Quantised drafter weights run on the CPU backend only: one line, exit 2.
  RunResult refused = RunCli("generate --model " + stories_ +
                             " --prompt-ids '1 306' --max-new-tokens 4 --mode vericache"
                             " --draft-weights int8 --backend cuda");
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_EQ(CountLines(refused.err), 1) << refused.err;
  EXPECT_NE(refused.err.find("need the cpu backend"), std::string::npos) << refused.err;
}

// Workers on the CUDA backend (`vericache demo --worker-backend cuda`): the
// local cluster's verifier and drafter run every kernel on the GPU, and every
// output, in the vericache, full_local and full_remote modes, equals full-KV
// decoding on the cpu in the demo's own process. Skips where no GPU (or no
// CUDA build) is there.
TEST_F(CliTest, CudaWorkersNeverChangeTokens) {
  if (const std::string why = CudaUnavailable(); !why.empty()) GTEST_SKIP() << why;
  if (HasFailure()) return;
  RunResult demo = RunCli("demo --model " + stories_ +
                          " --worker-backend cuda --requests 4 --prefixes 2 --max-new-tokens 48"
                          " --insecure --json");
  ASSERT_EQ(demo.exit_code, 0) << demo.err;
  const auto report = nlohmann::json::parse(demo.out);
  EXPECT_TRUE(report["all_identical"].get<bool>()) << demo.out;
}

// Tensor parallelism changes no token (docs/numerics.md section 6), in full
// and VeriCache mode, on both test models.
TEST_F(CliTest, TensorParallelNeverChangesTokens) {
  for (const std::string& model : {stories_, aidreams_}) {
    const std::string base = "generate --model " + model +
                             " --prompt-ids \"$(yes '1 306 461 260' | head -n 10 | tr '\\n' ' ')\""
                             " --max-new-tokens 80 --ignore-eos --json";
    for (const std::string& mode :
         {std::string(""), std::string(" --mode vericache --compressor snapkv --ratio 0.25 --draft-len 8"),
          std::string(" --mode vericache --compressor kivi --bits 2 --draft-len auto")}) {
      RunResult ref = RunCli(base + mode + " --tensor-parallel 1");
      ASSERT_EQ(ref.exit_code, 0) << model << mode << ": " << ref.err;
      const auto tokens = nlohmann::json::parse(ref.out)["tokens"];
      ASSERT_EQ(tokens.size(), 80u);
      for (const char* tp : {" --tensor-parallel 2", " --tensor-parallel 4 --threads 2"}) {
        RunResult r = RunCli(base + mode + tp);
        ASSERT_EQ(r.exit_code, 0) << model << mode << tp << ": " << r.err;
        EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"], tokens) << model << mode << tp;
      }
    }
  }
  // And the independent float64 continuation of ../shared/models/README.md.
  RunResult r = RunCli("generate --model " + aidreams_ + " --tokenizer " + tok_ +
                       " --prompt 'I dream of' --max-new-tokens 40 --tensor-parallel 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("I dream of 0.000000. Dimensions unfold, as I softly refine"),
            std::string::npos)
      << r.out;
}

TEST_F(CliTest, SeededSamplingIsReproducibleAndSeedDependent) {
  const std::string base = "generate --model " + stories_ +
                           " --prompt-ids '1 306' --max-new-tokens 60 --ignore-eos --json "
                           "--temperature 0.9 --top-p 0.95";
  auto a = nlohmann::json::parse(RunCli(base + " --seed 5").out)["tokens"];
  auto b = nlohmann::json::parse(RunCli(base + " --seed 5 --threads 1").out)["tokens"];
  auto c = nlohmann::json::parse(RunCli(base + " --seed 6").out)["tokens"];
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(CliTest, TextPromptOnAidreams) {
  RunResult r = RunCli("generate --model " + aidreams_ + " --tokenizer " + tok_ +
                    " --prompt 'I dream of' --max-new-tokens 40");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The continuation stated in ../shared/models/README.md (measured there with
  // an independent float64 implementation).
  EXPECT_NE(r.out.find("I dream of 0.000000. Dimensions unfold, as I softly refine"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos);
}

TEST_F(CliTest, BadInputExitsTwoWithOneLine) {
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {"generate --model " + stories_ + " --prompt-ids '1 9999' --max-new-tokens 5",
       "outside the vocabulary"},
      {"generate --model " + stories_ + " --prompt-ids '1 x' --max-new-tokens 5", "not an integer"},
      {"generate --model " + stories_ + " --prompt-ids \"$(yes 1 | head -n 513 | tr '\\n' ' ')\"" +
           " --max-new-tokens 5",
       "longer than the model's context"},
      {"generate --model " + stories_ + " --prompt-ids '1 2' --max-new-tokens 600",
       "exceeds the model's context"},
      {"generate --model /nonexistent.bin --prompt-ids '1' --max-new-tokens 5", "/nonexistent.bin"},
      {"generate --model " + stories_ + " --prompt-ids '1' --bogus", "unknown flag --bogus"},
      {"generate --model " + stories_ + " --prompt-ids '1' --max-new-tokens 0", "max-new-tokens"},
      {"generate --model " + stories_ + " --prompt-ids '1' --temperature -1", "temperature"},
      {"generate --model " + stories_ + " --prompt-ids '1' --top-k 5", "--temperature"},
      {"generate --model " + stories_ + " --prompt 'hi'", "--tokenizer"},
      {"generate --model " + stories_ + " --prompt-ids '1' --simd avx9", "avx9"},
      {"generate --model " + stories_ + " --prompt-ids '1' --tensor-parallel 3",
       "tensor-parallel degree 3"},
      {"generate --model " + stories_ + " --prompt-ids '1' --tensor-parallel 8",
       "n_kv_heads 4"},
      {"generate --prompt-ids '1'", "--model is required"},
      {"frobnicate", "unknown command"},
  };
  for (const Case& c : cases) {
    RunResult r = RunCli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
  }
}

TEST_F(CliTest, VeriCacheModeIsLosslessAndReportsItsWork) {
  // A 100-token prompt, long enough for KIVI to quantise beyond its
  // full-precision residual window.
  const std::string base = "generate --model " + stories_ +
                           " --prompt-ids \"$(yes '1 306 461 260' | head -n 25 | tr '\\n' ' ')\""
                           " --max-new-tokens 150 --ignore-eos --json";
  auto full = nlohmann::json::parse(RunCli(base).out);
  for (const std::string& extra :
       {std::string(" --mode vericache --compressor snapkv --ratio 0.25 --draft-len 8"),
        std::string(" --mode vericache --compressor kivi --bits 2 --draft-len auto"),
        std::string(" --mode vericache --compressor h2o+int8 --ratio 0.5 --draft-len 16 --no-kv-refresh")}) {
    RunResult r = RunCli(base + extra);
    ASSERT_EQ(r.exit_code, 0) << extra << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["mode"], "vericache");
    EXPECT_EQ(j["tokens"], full["tokens"]) << extra;
    EXPECT_EQ(j["drafter_full_kv_bytes_read"], 0);
    EXPECT_GT(j["verify_rounds"].get<int>(), 0);
    EXPECT_EQ(j["accept_lengths"].size(), j["verify_rounds"].get<size_t>());
    EXPECT_GT(j["kv_bytes"]["full"].get<int64_t>(), j["kv_bytes"]["compressed"].get<int64_t>());
    EXPECT_GT(j["compression_ratio"].get<double>(), 0.0);
    EXPECT_LT(j["compression_ratio"].get<double>(), 1.0);
    EXPECT_FALSE(j.contains("lossy"));
  }
  auto lossy = nlohmann::json::parse(
      RunCli(base + " --mode lossy --compressor streamingllm --ratio 0.1").out);
  EXPECT_EQ(lossy["mode"], "lossy");
  EXPECT_EQ(lossy["lossy"], true);
  EXPECT_NE(lossy["tokens"], full["tokens"]);  // this model is fragile: 10% KV drifts at once
}

TEST_F(CliTest, OnlineUpdateStaysLosslessAndBoundsTheDrafterView) {
  const std::string base = "generate --model " + stories_ +
                           " --prompt-ids \"$(yes '1 306 461 260' | head -n 10 | tr '\\n' ' ')\""
                           " --max-new-tokens 200 --ignore-eos --json";
  auto full = nlohmann::json::parse(RunCli(base).out);
  const std::string vc = base + " --mode vericache --compressor streamingllm --ratio 0.25";
  RunResult off = RunCli(vc);
  RunResult on = RunCli(vc + " --online-update");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  ASSERT_EQ(on.exit_code, 0) << on.err;
  auto j_off = nlohmann::json::parse(off.out);
  auto j_on = nlohmann::json::parse(on.out);
  EXPECT_EQ(j_on["tokens"], full["tokens"]);
  EXPECT_EQ(j_on["online_update"], true);
  EXPECT_EQ(j_off["online_update"], false);
  EXPECT_GT(j_on["online_folds"].get<int64_t>(), 0);
  EXPECT_LT(2 * j_on["drafter_kv_bytes_peak"].get<int64_t>(),
            j_off["drafter_kv_bytes_peak"].get<int64_t>());
  RunResult lossy = RunCli(base + " --mode lossy --compressor kivi --bits 4 --online-update");
  ASSERT_EQ(lossy.exit_code, 0) << lossy.err;
  EXPECT_EQ(nlohmann::json::parse(lossy.out)["online_update"], true);
}

TEST_F(CliTest, BadVeriCacheCombinationsExitTwo) {
  const std::string base = "generate --model " + stories_ + " --prompt-ids '1 2 3' --max-new-tokens 5";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --mode vericache --compressor zip", "zip"},
      {" --mode vericache --compressor snapkv --ratio 1.5", "--ratio"},
      {" --mode vericache --compressor snapkv --ratio 0", "--ratio"},
      {" --mode vericache --compressor kivi --ratio 0.5", "ratio"},
      {" --mode vericache --compressor snapkv --ratio 0.5 --bits 4", "bits"},
      {" --mode vericache --compressor int8 --draft-len 0", "draft length"},
      {" --mode vericache --compressor int8 --draft-len fast", "--draft-len"},
      {" --mode warp", "unknown mode"},
      {" --compressor int8", "--mode"},
      {" --sampling seeded", "--temperature"},
      {" --sampling magic --temperature 1", "unknown sampling"},
      {" --mode vericache --compressor snapkv --ratio 0.5 --online-update", "no online rule"},
      {" --online-update", "--online-update applies to --mode vericache or lossy"},
      {" --mode vericache --draft-weights int3", "int3"},
      {" --draft-weights int8", "--draft-weights"},
      {" --mode lossy --draft-weights int4", "--draft-weights"},
  };
  for (const auto& [extra, needle] : cases) {
    RunResult r = RunCli(base + extra);
    EXPECT_EQ(r.exit_code, 2) << extra << "\n" << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << extra << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << extra << "\n" << r.err;
  }
}

TEST_F(CliTest, CompressorsListsEveryMethod) {
  RunResult r = RunCli("compressors --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  std::set<std::string> names;
  for (const auto& c : j) names.insert(c["name"].get<std::string>());
  for (const char* n : {"streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "kivi", "int8",
                        "snapkv+kivi"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  for (const auto& c : j) {
    const std::string name = c["name"].get<std::string>();
    EXPECT_FALSE(c["online_rule"].get<std::string>().empty()) << name;
    const std::string online = c["online"].get<std::string>();
    if (name == "snapkv" || name == "pyramidkv") {
      EXPECT_EQ(online, "none") << name;
    } else if (name == "streamingllm" || name == "h2o" || name == "tova" ||
               name.starts_with("h2o+")) {
      EXPECT_EQ(online, "every-token") << name;
    } else if (name == "kivi" || name == "int8" || name.starts_with("snapkv+")) {
      EXPECT_EQ(online, "per-group") << name;
    }
  }
  RunResult table = RunCli("compressors");
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("--ratio"), std::string::npos);
  EXPECT_NE(table.out.find("online update:"), std::string::npos);
}

TEST_F(CliTest, HelpDescribesEveryFlag) {
  RunResult top = RunCli("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.out.find("generate"), std::string::npos);
  RunResult r = RunCli("generate --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag :
       {"--model",          "--prompt-ids",    "--prompt",        "--tokenizer",
        "--max-new-tokens", "--ignore-eos",    "--temperature",   "--top-k",
        "--top-p",          "--seed",          "--threads",       "--tensor-parallel",
        "--simd",           "--json",          "--mode",          "--compressor",
        "--ratio",          "--bits",          "--draft-len",     "--sampling",
        "--no-kv-refresh",  "--online-update", "--draft-weights", "--draft-model"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
