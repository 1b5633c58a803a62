// vc_cuda_matmul_bench: the CUDA backend's DotRows kernels (the canonical
// matrix products, kernels/cuda/) on device-resident buffers, for the
// products of a verify pass (1..33 tokens) at two model sizes. For every
// tiling it times each product and checks that every tiling gives the same
// bits; it prints the weights' stream rate against a device-to-device copy
// measured in the same run and each pass's cost as a multiple of the
// 1-token product (the GPU counterpart of vc_single_node_bench's verify-pass
// table). Needs a CUDA device; exits 1 with one line without one.
//
//   vc_cuda_matmul_bench [--reps N] [--tokens 1,2,4,9,17,33] [--model 7b|110m|all]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/int_list.h"
#include "kernels/cuda/internal/cuda_kernels.h"

namespace {

using vc::kernels::cuda::DotRowsTiling;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "vc_cuda_matmul_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    Die(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

struct Shape {
  const char* name;
  int64_t in, out;
  int count;  // how many such products one layer has
};

// Llama-2-7B's layer (dim 4096, hidden 11008; q, k, v, o; gate, up; down)
// and the 110M synthetic model of vc_single_node_bench (dim 1024, hidden
// 2816).
const std::vector<Shape> k7b = {{"qkvo 4096x4096", 4096, 4096, 4},
                                {"gate/up 4096x11008", 4096, 11008, 2},
                                {"down 11008x4096", 11008, 4096, 1}};
const std::vector<Shape> k110m = {{"qkvo 1024x1024", 1024, 1024, 4},
                                  {"gate/up 1024x2816", 1024, 2816, 2},
                                  {"down 2816x1024", 2816, 1024, 1}};

// Larger than the H200's 60 MB L2 several times over: weights are cycled
// through copies at least this large, so every product streams them from
// HBM as in a real pass (where the layer's other matrices evict them).
constexpr size_t kColdBytes = size_t{512} << 20;

std::vector<float> Random(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-8, 8);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
  return v;
}

struct DeviceArray {
  float* p = nullptr;
  explicit DeviceArray(size_t n) {
    Check(cudaMalloc(&p, std::max<size_t>(n, 1) * 4), "cudaMalloc");
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy rate in bytes/s (read + write counted), median of reps.
double CopyRate(int reps, cudaStream_t s) {
  const size_t n = size_t{1} << 28;  // 1 GiB
  DeviceArray a(n), b(n);
  Check(cudaMemsetAsync(a.p, 0, n * 4, s), "cudaMemset");
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "cudaEventCreate");
  Check(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    Check(cudaEventRecord(e0, s), "cudaEventRecord");
    Check(cudaMemcpyAsync(b.p, a.p, n * 4, cudaMemcpyDeviceToDevice, s), "cudaMemcpy");
    Check(cudaEventRecord(e1, s), "cudaEventRecord");
    Check(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (r >= 2) t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(n) * 4 / Median(t);
}

struct Result {
  std::vector<double> seconds;  // per tiling
  int best = 0;
};

// One product's weights on the device, in enough copies to be cold in L2.
struct Weights {
  Weights(const Shape& shape, std::mt19937_64& rng)
      : n(static_cast<size_t>(shape.in * shape.out)),
        copies(static_cast<int>(std::max<size_t>(1, (kColdBytes + n * 4 - 1) / (n * 4)))),
        w(n * copies),
        bias(static_cast<size_t>(shape.out)) {
    const auto hw = Random(rng, n), hb = Random(rng, static_cast<size_t>(shape.out));
    Check(cudaMemcpy(w.p, hw.data(), n * 4, cudaMemcpyHostToDevice), "upload w");
    for (int c = 1; c < copies; ++c) {
      Check(cudaMemcpy(w.p + n * c, w.p, n * 4, cudaMemcpyDeviceToDevice), "copy w");
    }
    Check(cudaMemcpy(bias.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice), "upload bias");
  }
  const size_t n;
  const int copies;
  DeviceArray w, bias;
};

// "4x4/64": rows x tokens / loads in flight.
std::string Name(const DotRowsTiling& t) {
  return std::to_string(t.rows) + "x" + std::to_string(t.tokens) + "/" + std::to_string(t.loads);
}

// Times every tiling of one (shape, tokens) product; dies if two tilings
// differ in any bit.
Result TimeProduct(const Shape& shape, const Weights& weights, int64_t tokens, int reps,
                   cudaStream_t s, std::mt19937_64& rng) {
  DeviceArray x(static_cast<size_t>(tokens * shape.in)), y(static_cast<size_t>(tokens * shape.out));
  {
    const auto hx = Random(rng, static_cast<size_t>(tokens * shape.in));
    Check(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice), "upload x");
  }
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "cudaEventCreate");
  Check(cudaEventCreate(&e1), "cudaEventCreate");
  const int n = vc::kernels::cuda::DotRowsTilingCount();
  Result result;
  std::vector<float> want, got(static_cast<size_t>(tokens * shape.out));
  int next = 0;
  for (int k = 0; k < n; ++k) {
    const DotRowsTiling tiling = vc::kernels::cuda::DotRowsTilingAt(k);
    std::vector<double> t;
    for (int r = 0; r < reps + 2; ++r) {
      const float* wc = weights.w.p + weights.n * (next++ % weights.copies);
      Check(cudaEventRecord(e0, s), "cudaEventRecord");
      Check(vc::kernels::cuda::LaunchDotRowsTiled(tiling, x.p, tokens, wc, weights.bias.p, shape.in,
                                                  shape.out, false, 1.0f, y.p, s),
            "launch");
      Check(cudaEventRecord(e1, s), "cudaEventRecord");
      Check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      if (r >= 2) t.push_back(ms * 1e-3);
    }
    Check(cudaMemcpy(got.data(), y.p, got.size() * 4, cudaMemcpyDeviceToHost), "download y");
    if (k == 0) {
      want = got;
    } else if (std::memcmp(want.data(), got.data(), got.size() * 4) != 0) {
      Die(std::string("tilings differ: ") + shape.name + ", " + std::to_string(tokens) +
          " tokens, tiling " + Name(tiling));
    }
    result.seconds.push_back(Median(t));
    if (result.seconds.back() < result.seconds[result.best]) result.best = k;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return result;
}

int IndexOf(DotRowsTiling t) {
  for (int k = 0; k < vc::kernels::cuda::DotRowsTilingCount(); ++k) {
    if (vc::kernels::cuda::DotRowsTilingAt(k) == t) return k;
  }
  Die("the default tiling has no kernel");
}

void RunModel(const char* model, const std::vector<Shape>& shapes,
              const std::vector<int64_t>& token_counts, int reps, double copy_rate,
              cudaStream_t s) {
  std::mt19937_64 rng(42);
  const int n = vc::kernels::cuda::DotRowsTilingCount();
  std::printf("\n== %s layer\n", model);
  // Per token count: a layer's time with the default tiling and with the
  // best tiling of each product.
  std::vector<double> layer_default(token_counts.size()), layer_best(token_counts.size());
  double layer_bytes = 0;
  for (const Shape& shape : shapes) {
    const double bytes = static_cast<double>(shape.in * shape.out) * 4;
    layer_bytes += bytes * shape.count;
    std::printf(
        "\n%s (x%d), %.1f MB of weights; us per product by tiling (rows x tokens / loads in "
        "flight):\n",
        shape.name, shape.count, bytes / 1e6);
    std::printf("%6s", "tokens");
    for (int k = 0; k < n; ++k) {
      const DotRowsTiling t = vc::kernels::cuda::DotRowsTilingAt(k);
      std::printf(" %7s", Name(t).c_str());
    }
    std::printf(" | default  best(tiling)  GB/s  x copy\n");
    const Weights weights(shape, rng);
    for (size_t j = 0; j < token_counts.size(); ++j) {
      const int64_t tokens = token_counts[j];
      const Result r = TimeProduct(shape, weights, tokens, reps, s, rng);
      std::printf("%6lld", static_cast<long long>(tokens));
      for (double sec : r.seconds) std::printf(" %7.1f", sec * 1e6);
      const int d = IndexOf(vc::kernels::cuda::DefaultDotRowsTiling(tokens));
      const DotRowsTiling b = vc::kernels::cuda::DotRowsTilingAt(r.best);
      const double rate = bytes / r.seconds[r.best];
      std::printf(" | %7.1f %6.1f(%s) %6.0f  %.2f\n", r.seconds[d] * 1e6, r.seconds[r.best] * 1e6,
                  Name(b).c_str(), rate / 1e9, rate / copy_rate);
      layer_default[j] += r.seconds[d] * shape.count;
      layer_best[j] += r.seconds[r.best] * shape.count;
    }
  }
  std::printf(
      "\n%s layer (%.1f MB of weights): products of a pass, as a multiple of the "
      "1-token pass\n%6s %12s %8s %12s %8s\n",
      model, layer_bytes / 1e6, "tokens", "default us", "x 1-tok", "best us", "x 1-tok");
  for (size_t j = 0; j < token_counts.size(); ++j) {
    std::printf("%6lld %12.1f %8.2f %12.1f %8.2f\n", static_cast<long long>(token_counts[j]),
                layer_default[j] * 1e6, layer_default[j] / layer_default[0], layer_best[j] * 1e6,
                layer_best[j] / layer_best[0]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::vector<int64_t> tokens = {1, 2, 4, 9, 17, 33};
  std::string model = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--reps") {
      reps = std::atoi(value().c_str());
      if (reps < 1 || reps > 10000) Die("--reps wants 1..10000");
    } else if (a == "--tokens") {
      absl::StatusOr<std::vector<int64_t>> list =
          vc::bench::ParseIntList("--tokens", value(), 1, 4096);
      if (!list.ok()) Die(std::string(list.status().message()));
      tokens = *std::move(list);
      if (tokens[0] != 1) tokens.insert(tokens.begin(), 1);  // the baseline
    } else if (a == "--model") {
      model = value();
      if (model != "7b" && model != "110m" && model != "all") Die("--model wants 7b, 110m or all");
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "vc_cuda_matmul_bench [--reps N] [--tokens 1,2,4,9,17,33] [--model 7b|110m|all]\n");
      return 0;
    } else {
      Die("unknown flag " + a + " (--help lists them)");
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) Die("no CUDA device");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t s = nullptr;
  Check(cudaStreamCreate(&s), "cudaStreamCreate");
  const double copy = CopyRate(reps, s);
  std::printf(
      "device: %s, %d SMs, L2 %.0f MB; device-to-device copy %.0f GB/s (read + write, "
      "median of %d); %d reps per product (median), weights cycled through >= %zu MB\n",
      prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, copy / 1e9, reps, reps,
      kColdBytes >> 20);
  if (model == "7b" || model == "all") RunModel("7B", k7b, tokens, reps, copy, s);
  if (model == "110m" || model == "all") RunModel("110M", k110m, tokens, reps, copy, s);
  std::printf("\nevery tiling gave the same bits for every product\n");
  cudaStreamDestroy(s);
  return 0;
}
