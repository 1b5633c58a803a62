// Private to common/model: what a Model's weight pointers point into, and the
// one way loaders assemble a Model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/mapped_file.h"
#include "common/model/model.h"

namespace vc {

struct Model::Storage {
  std::vector<MappedFile> files;           // f32 tensors are used in place
  std::vector<std::vector<float>> owned;   // widened or generated tensors
};

class ModelBuilder {
 public:
  static std::unique_ptr<Model> Make(ModelConfig config, ModelWeights weights, std::string source,
                                     std::unique_ptr<Model::Storage> storage);
};

}  // namespace vc
