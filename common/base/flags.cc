#include "common/base/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vc {
namespace {

absl::Status BadValue(const std::string& name, const std::string& value, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("flag ", name, ": '", value, "' is not ", want));
}

template <typename T>
std::string DefaultText(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::AddFlag(Flag flag) { flags_.push_back(std::move(flag)); }

void FlagSet::Add(const std::string& name, std::string* value, const std::string& metavar,
                  const std::string& help) {
  AddFlag({name, metavar, help, value->empty() ? "" : "\"" + *value + "\"", false,
           [value](const std::string& v) {
             *value = v;
             return absl::OkStatus();
           }});
}

void FlagSet::Add(const std::string& name, int64_t* value, const std::string& metavar,
                  const std::string& help) {
  AddFlag({name, metavar, help, DefaultText(*value), false, [name, value](const std::string& v) {
             if (!absl::SimpleAtoi(v, value)) return BadValue(name, v, "an integer");
             return absl::OkStatus();
           }});
}

void FlagSet::Add(const std::string& name, int* value, const std::string& metavar,
                  const std::string& help) {
  AddFlag({name, metavar, help, DefaultText(*value), false, [name, value](const std::string& v) {
             if (!absl::SimpleAtoi(v, value)) return BadValue(name, v, "an integer");
             return absl::OkStatus();
           }});
}

void FlagSet::Add(const std::string& name, uint64_t* value, const std::string& metavar,
                  const std::string& help) {
  AddFlag({name, metavar, help, DefaultText(*value), false, [name, value](const std::string& v) {
             if (!absl::SimpleAtoi(v, value)) return BadValue(name, v, "a non-negative integer");
             return absl::OkStatus();
           }});
}

void FlagSet::Add(const std::string& name, double* value, const std::string& metavar,
                  const std::string& help) {
  AddFlag({name, metavar, help, DefaultText(*value), false, [name, value](const std::string& v) {
             if (!absl::SimpleAtod(v, value) || !std::isfinite(*value)) {
               return BadValue(name, v, "a finite number");
             }
             return absl::OkStatus();
           }});
}

void FlagSet::Add(const std::string& name, float* value, const std::string& metavar,
                  const std::string& help) {
  AddFlag({name, metavar, help, DefaultText(*value), false, [name, value](const std::string& v) {
             if (!absl::SimpleAtof(v, value) || !std::isfinite(*value)) {
               return BadValue(name, v, "a finite number");
             }
             return absl::OkStatus();
           }});
}

void FlagSet::AddBool(const std::string& name, bool* value, const std::string& help) {
  AddFlag({name, "", help, *value ? "true" : "", true, [name, value](const std::string& v) {
             if (v.empty() || v == "true" || v == "1") {
               *value = true;
             } else if (v == "false" || v == "0") {
               *value = false;
             } else {
               return BadValue(name, v, "true or false");
             }
             return absl::OkStatus();
           }});
}

absl::Status FlagSet::Parse(int argc, const char* const* argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (flags start with --; see --help)"));
    }
    std::string name = arg, value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", name, " for '", command_, "' (see --help)"));
    }
    if (!has_value && !flag->is_bool) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("flag ", name, " needs a value"));
      value = argv[++i];
    }
    if (absl::Status s = flag->set(value); !s.ok()) return s;
    set_.insert(name);
  }
  return absl::OkStatus();
}

std::string FlagSet::Help() const {
  std::string out = absl::StrCat("usage: ", command_, " [flags]\n\n", summary_, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    std::string left = f.metavar.empty() ? f.name : absl::StrCat(f.name, " ", f.metavar);
    absl::StrAppend(&out, "  ", left);
    const size_t pad = left.size() < 28 ? 28 - left.size() : 1;
    absl::StrAppend(&out, std::string(pad, ' '), f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "  --help                      show this help\n");
  return out;
}

}  // namespace vc
