// OpenAI `stop` strings over streamed text: text passes through until one of
// the stop strings appears, and the text from that point on (the stop string
// included) is never emitted. A stop string can span several pieces of input,
// so whatever could still be the start of one is held back until the next
// piece shows whether it is. Input must be valid UTF-8 (the detokenizer's
// output); held-back text always starts at a character boundary, so the
// emitted pieces never split a character.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vc::openai {

class StopStringFilter {
 public:
  // Empty strings in `stops` are ignored (the parser refuses them).
  explicit StopStringFilter(std::vector<std::string> stops);

  // Feeds `text`; returns what can be emitted now (possibly empty). Once a
  // stop string matched, stopped() is true and every later call returns "".
  std::string Push(std::string_view text);
  // End of input without a match: the held-back text.
  std::string Finish();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace vc::openai
