// Chat-template parsing and rendering (ChatTemplate::Parse, Render) on
// arbitrary template source, rendered over a fixed small conversation, with
// and without the generation prompt. Input: the template text. Small render
// limits keep each input fast. Invariants: a parse error is InvalidArgument;
// a render error is InvalidArgument (raise_exception, type errors, undefined
// names) or ResourceExhausted (a limit); output within max_output_bytes; a
// second render gives the same bytes (no state leaks between renders).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/chat/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  vc::ChatTemplateLimits limits;
  limits.max_output_bytes = 64 << 10;
  limits.max_work_bytes = 4 << 20;
  limits.max_loop_iterations = 20'000;
  limits.max_call_depth = 16;
  auto tmpl = vc::ChatTemplate::Parse(source, limits);
  if (!tmpl.ok()) {
    VC_FUZZ_CHECK(absl::IsInvalidArgument(tmpl.status()), std::string(tmpl.status().message()).c_str());
    return 0;
  }
  vc::ChatTemplateInputs in;
  in.messages = {{"system", "Be brief."},
                 {"user", "Hi <b>there</b> \xc3\xa9\xf0\x9f\x98\x80"},
                 {"assistant", "  Hello!\n"},
                 {"user", "{{ not a template }}"}};
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  for (bool generation_prompt : {true, false}) {
    in.add_generation_prompt = generation_prompt;
    auto out = (*tmpl)->Render(in);
    if (!out.ok()) {
      const absl::Status& s = out.status();
      VC_FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsResourceExhausted(s), std::string(s.message()).c_str());
      continue;
    }
    VC_FUZZ_CHECK(out->size() <= limits.max_output_bytes, "output within its limit");
    auto again = (*tmpl)->Render(in);
    VC_FUZZ_CHECK(again.ok() && *again == *out, "a second render gives the same text");
  }
  return 0;
}
