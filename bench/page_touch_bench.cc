// vc_page_touch_bench: what the first CPU access of a page costs on this
// machine, in CPU time of this process per 4 KiB page (docs/results.md
// section 8, "Warm-up"). A file mapped with MAP_POPULATE, anonymous memory
// mapped with MAP_POPULATE, and fresh anonymous memory, each touched (one
// byte per page) twice; the second touch is the steady cost. On bare metal
// the populated first touch costs about what the second does; under some
// hypervisors it costs microseconds more, which no guest fault counter shows
// (the minor-fault column stays 0), so only touching the pages once at load
// takes it out of the first forward passes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/flags.h"

namespace {

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

long MinorFaults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// Reads (or writes) one byte per page of [p, p + bytes) and prints the CPU
// microseconds per page and the minor faults it took.
void Touch(const char* what, uint8_t* p, size_t bytes, bool write) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const long f0 = MinorFaults();
  const double c0 = CpuSeconds();
  uint8_t sum = 0;
  for (size_t i = 0; i < bytes; i += page) {
    if (write) {
      p[i] = 1;
    } else {
      sum ^= p[i];
    }
  }
  volatile uint8_t keep = sum;  // the reads must not be optimised away
  (void)keep;
  const double us =
      (CpuSeconds() - c0) * 1e6 / (static_cast<double>(bytes) / static_cast<double>(page));
  std::printf("  %-44s %8.3f us CPU per page, %7ld minor faults\n", what, us, MinorFaults() - f0);
}

absl::Status Run(int64_t mib) {
  const size_t bytes = static_cast<size_t>(mib) << 20;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("vc_page_touch_bench." + std::to_string(::getpid())))
                               .string();
  {
    // The file's pages are in the page cache when it is mapped (as a model
    // file is after its first load).
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return absl::InternalError("cannot create " + path);
    const std::vector<uint8_t> chunk(1 << 20, 7);
    bool ok = true;
    for (int64_t i = 0; i < mib; ++i)
      ok = ok && std::fwrite(chunk.data(), 1, chunk.size(), f) == chunk.size();
    ok = std::fclose(f) == 0 && ok;
    if (!ok) return absl::InternalError("cannot write " + path);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::filesystem::remove(path);
  if (fd < 0) return absl::InternalError("cannot open " + path);
  void* file = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  ::close(fd);
  void* anon = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  void* fresh = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (file == MAP_FAILED || anon == MAP_FAILED || fresh == MAP_FAILED) {
    return absl::InternalError("mmap failed");
  }
  std::printf("%lld MiB each, one byte per page:\n", static_cast<long long>(mib));
  auto* fp = static_cast<uint8_t*>(file);
  auto* ap = static_cast<uint8_t*>(anon);
  auto* np = static_cast<uint8_t*>(fresh);
  Touch("file, MAP_POPULATE: first read", fp, bytes, false);
  Touch("file, MAP_POPULATE: second read", fp, bytes, false);
  Touch("anonymous, MAP_POPULATE: first write", ap, bytes, true);
  Touch("anonymous, MAP_POPULATE: second write", ap, bytes, true);
  Touch("anonymous, not populated: first write", np, bytes, true);
  Touch("anonymous, not populated: second write", np, bytes, true);
  ::munmap(file, bytes);
  ::munmap(anon, bytes);
  ::munmap(fresh, bytes);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 64;
  vc::FlagSet flags("vc_page_touch_bench",
                    "CPU cost of the first and second touch of a page: populated file and "
                    "anonymous mappings, and fresh anonymous memory.");
  flags.Add("--mib", &mib, "N", "MiB per mapping (1..4096)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Help().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (mib < 1 || mib > 4096) {
    std::fprintf(stderr, "vc_page_touch_bench: --mib must be in [1, 4096]\n");
    return 2;
  }
  if (absl::Status s = Run(mib); !s.ok()) {
    std::fprintf(stderr, "vc_page_touch_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
