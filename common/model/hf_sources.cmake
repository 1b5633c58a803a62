target_sources(vc_model PRIVATE
  model/hf_loader.cc
  model/internal/safetensors.cc
)
target_link_libraries(vc_model PRIVATE nlohmann_json::nlohmann_json)
