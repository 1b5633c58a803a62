// Command-line flags for the vericache tools and daemons: each flag is bound
// to a field of an options struct, so defaults live in the struct and the
// help text is generated from the same table that parses.
//
//   FlagSet flags("vericache generate", "Generate tokens with the engine.");
//   flags.Add("--model", &opts.model_path, "PATH", "model file or HF directory");
//   absl::Status s = flags.Parse(argc, argv);  // InvalidArgument on bad input
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace vc {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void Add(const std::string& name, std::string* value, const std::string& metavar,
           const std::string& help);
  void Add(const std::string& name, int64_t* value, const std::string& metavar,
           const std::string& help);
  void Add(const std::string& name, int* value, const std::string& metavar, const std::string& help);
  void Add(const std::string& name, double* value, const std::string& metavar,
           const std::string& help);
  void Add(const std::string& name, float* value, const std::string& metavar,
           const std::string& help);
  void Add(const std::string& name, uint64_t* value, const std::string& metavar,
           const std::string& help);
  // A switch: present means true ("--x=false" also accepted).
  void AddBool(const std::string& name, bool* value, const std::string& help);

  // Parses argv[first..argc). "--flag value" and "--flag=value" both work;
  // "--help"/"-h" sets help_requested(). Errors name the flag and the problem.
  absl::Status Parse(int argc, const char* const* argv, int first = 1);

  bool help_requested() const { return help_requested_; }
  bool was_set(const std::string& name) const { return set_.count(name) > 0; }
  // Usage text listing every flag with its metavar, help and default.
  std::string Help() const;

 private:
  struct Flag {
    std::string name, metavar, help, default_text;
    bool is_bool = false;
    std::function<absl::Status(const std::string&)> set;
  };
  void AddFlag(Flag flag);

  std::string command_, summary_;
  std::vector<Flag> flags_;
  std::set<std::string> set_;
  bool help_requested_ = false;
};

}  // namespace vc
