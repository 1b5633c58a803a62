// Private to common/model: what a Model's weight pointers point into, and the
// one way loaders assemble a Model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/cache_line_allocator.h"
#include "common/base/mapped_file.h"
#include "common/model/model.h"

namespace vc {

struct Model::Storage {
  std::vector<MappedFile> files;           // f32 tensors are used in place
  // Widened or generated tensors, and bf16/f16 matrices not usable in
  // place; each starts on a cache line.
  std::vector<CacheLineVector<float>> owned;
  std::vector<CacheLineVector<uint16_t>> owned16;
};

class ModelBuilder {
 public:
  static std::unique_ptr<Model> Make(ModelConfig config, ModelWeights weights, std::string source,
                                     std::unique_ptr<Model::Storage> storage);
};

}  // namespace vc
