// The simulator's JSON config (ParseSimConfig, bench/sim/README.md) on
// arbitrary text, with an acceptance CSV beside it (empirical acceptance
// reads "csv" relative to the config's directory). Input: u16 little-endian
// length N, N bytes of config JSON, then the bytes of acc.csv. Invariants:
// errors are InvalidArgument or NotFound (an unreadable CSV); a config that
// parses passes its own Validate().
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/sim/simulator.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  Input in(data, size);
  const std::string config = in.Bytes(in.U16());
  WriteScratch("acc.csv", in.Rest());
  auto parsed = vc::sim::ParseSimConfig(config, ScratchDir());
  if (!parsed.ok()) {
    const absl::Status& s = parsed.status();
    VC_FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsNotFound(s),
                  std::string(s.message()).c_str());
    return 0;
  }
  const absl::Status valid = parsed->Validate();
  VC_FUZZ_CHECK(valid.ok(), std::string(valid.message()).c_str());
  return 0;
}
