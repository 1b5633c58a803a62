// A verify pass of T tokens on top of a long context is bit-identical to T
// one-token decode steps: the logits of every row and the K/V rows it writes.
// Head-major attention (every KV block read once for all the pass's queries)
// and the multi-token matmuls may change only the order in which independent
// outputs are computed, never an output's value.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "tests/sanitizer_scale.h"

namespace vc {
namespace {

struct Subject {
  std::string name;
  std::unique_ptr<Model> model;
  int context = 0;  // tokens prefilled before the passes
};

ModelConfig RandomShape(int heads, int kv_heads, int window) {
  ModelConfig c;
  c.architecture = "random";
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 2;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.max_seq_len = 1100;
  c.sliding_window = window;
  return c;
}

std::vector<Subject> Subjects() {
  std::vector<Subject> out;
  // Long contexts: ~1000 keys per query, so a pass spans many KV blocks.
  for (const auto& [name, config] :
       {std::pair<std::string, ModelConfig>{"random_gqa2_ctx1000", RandomShape(4, 2, 0)},
        {"random_mha_window300_ctx1000", RandomShape(4, 4, 300)},
        {"random_gqa4_ctx1000", RandomShape(8, 2, 0)}}) {
    auto m = Model::CreateRandom(config, 5);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status();
    if (m.ok()) out.push_back({name, std::move(*m), 1000});
  }
  const char* dir = std::getenv("VC_MODELS_DIR");
  const std::string path = dir == nullptr ? "" : std::string(dir) + "/stories260K.bin";
  if (path.empty() || !std::filesystem::exists(path)) {
    std::cout << "stories260K.bin not found in VC_MODELS_DIR; skipped\n";
  } else {
    auto m = Model::Load(path);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) out.push_back({"stories260K", std::move(*m), 440});
  }
  return out;
}

absl::Status Forward(Engine& engine, PagedKvCache& kv, std::span<const int32_t> tokens,
                     std::vector<float>* logits) {
  SequenceInput in;
  in.kv = &kv;
  in.tokens = tokens;
  in.first_logit = 0;
  return engine.Forward(std::span<const SequenceInput>(&in, 1), logits);
}

TEST(VerifyPassTest, TTokenPassEqualsTOneTokenSteps) {
  for (const auto& s : Subjects()) {
    SCOPED_TRACE(s.name);
    const ModelConfig& c = s.model->config();
    for (const char* simd : {"auto", "scalar"}) {
      EngineOptions eo;
      eo.backend.threads = 2;
      eo.backend.simd = simd;
      auto engine = Engine::Create(*s.model, eo);
      ASSERT_TRUE(engine.ok()) << engine.status();
      std::mt19937_64 rng(7);
      std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
      std::vector<int32_t> tokens(static_cast<size_t>(s.context + 33));
      for (int32_t& t : tokens) t = tok(rng);
      PagedKvCache context(c);
      std::vector<float> logits;
      ASSERT_TRUE(Forward(**engine, context, std::span(tokens).first(s.context), &logits).ok());

      for (int passes :
           test_support::FullOrUnderSanitizer({1, 2, 3, 8, 9, 16, 17, 32, 33}, {1, 2, 9, 33})) {
        SCOPED_TRACE(::testing::Message() << simd << " T=" << passes);
        const auto pass = std::span(tokens).subspan(s.context, passes);
        PagedKvCache multi(c), steps(c);
        ASSERT_TRUE(multi.CopyFrom(context).ok());
        ASSERT_TRUE(steps.CopyFrom(context).ok());
        std::vector<float> want, got;
        for (int t = 0; t < passes; ++t) {
          ASSERT_TRUE(Forward(**engine, steps, pass.subspan(t, 1), &logits).ok());
          want.insert(want.end(), logits.begin(), logits.end());
        }
        ASSERT_TRUE(Forward(**engine, multi, pass, &got).ok());
        ASSERT_EQ(want.size(), got.size());
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
            << "logits differ";
        const size_t row = static_cast<size_t>(c.head_dim) * sizeof(float);
        for (int l = 0; l < c.n_layers; ++l) {
          for (int h = 0; h < c.n_kv_heads; ++h) {
            for (int32_t p = s.context; p < s.context + passes; ++p) {
              ASSERT_EQ(std::memcmp(multi.KeyAt(l, h, p), steps.KeyAt(l, h, p), row), 0)
                  << "K layer " << l << " head " << h << " position " << p;
              ASSERT_EQ(std::memcmp(multi.ValueAt(l, h, p), steps.ValueAt(l, h, p), row), 0)
                  << "V layer " << l << " head " << h << " position " << p;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace vc
