target_sources(vc_model PRIVATE
  model/hf_loader.cc
  model/generation_config.cc
  model/internal/json_file.cc
  model/internal/safetensors.cc
)
target_link_libraries(vc_model PRIVATE nlohmann_json::nlohmann_json)
