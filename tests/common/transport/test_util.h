// Helpers shared by the data plane tests.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport/data_plane.h"
#include "gtest/gtest.h"
#include "tests/common/transport/tls_test_certs.h"
#include "tests/scratch_dir.h"

namespace vc::transport::testing {

using Clock = std::chrono::steady_clock;

// Checks the code and that the message contains `substr`.
inline ::testing::AssertionResult HasCode(const absl::Status& s, absl::StatusCode code,
                                          const std::string& substr = "") {
  if (s.code() != code) {
    return ::testing::AssertionFailure()
           << "expected " << absl::StatusCodeToString(code) << ", got " << s;
  }
  if (std::string(s.message()).find(substr) == std::string::npos) {
    return ::testing::AssertionFailure() << "message of " << s << " lacks '" << substr << "'";
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult HasCode(const absl::StatusOr<T>& s, absl::StatusCode code,
                                   const std::string& substr = "") {
  return HasCode(s.status(), code, substr);
}

inline std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// A read-only blob table as the server's lookup.
inline BlobLookup MapLookup(std::shared_ptr<const std::map<std::string, std::string>> blobs) {
  return [blobs](const std::string& key) -> absl::StatusOr<std::string> {
    auto it = blobs->find(key);
    if (it == blobs->end()) return absl::NotFoundError("not in the test table");
    return it->second;
  };
}

inline Clock::time_point In(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A paced link's per-slot bound (bandwidth x slot + one piece) holds in
// every slot, and the slots add up to the link's total.
inline void ExpectSlotsWithinBound(const LinkStats& st, double bytes_per_second, int64_t piece) {
  const int64_t bound =
      static_cast<int64_t>(std::ceil(bytes_per_second * st.slots.slot_seconds)) + piece;
  int64_t sum = 0;
  for (size_t k = 0; k < st.slots.bytes_per_slot.size(); ++k) {
    EXPECT_LE(st.slots.bytes_per_slot[k], bound) << "slot " << st.slots.first_slot + int64_t(k);
    sum += st.slots.bytes_per_slot[k];
  }
  EXPECT_EQ(sum, st.bytes_total);
}

// Empty if UCX can make a context and worker here, else the reason.
inline std::string UcxUnavailableReason() {
  DataPlaneClientOptions o;
  o.kind = "ucx";
  o.server_address = "127.0.0.1:1";
  auto c = DataPlaneClient::Create(o);
  return c.ok() ? "" : c.status().ToString();
}

// Certificates for the "tls" runs, made once per test binary in a fresh
// scratch directory (removed when the process exits): a CA and two leaves
// it signs ("vc-server", "vc-client").
struct TlsFixtureFiles {
  test_support::ScratchDir dir{"vc_dp_tls_"};
  DataPlaneTlsOptions server, client;
};
inline const TlsFixtureFiles& TlsFiles() {
  static TlsFixtureFiles files;
  static const bool written = [] {
    TestCa ca("vc-test-ca");
    ca.WriteCa(files.dir / "ca.crt");
    files.server = ca.Leaf(files.dir.path(), "vc-server", files.dir / "ca.crt");
    files.client = ca.Leaf(files.dir.path(), "vc-client", files.dir / "ca.crt");
    return true;
  }();
  (void)written;
  return files;
}

// A test run once per backend ("tcp", "ucx", "tls": tcp with mutual TLS,
// and "ucxauth": ucx with the authenticated handshake and per-message
// MACs); UCX runs skip where UCX cannot create a context.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  // The backend kind of this run ("tls" runs are "tcp").
  std::string Kind() const {
    if (GetParam() == "tls") return "tcp";
    if (GetParam() == "ucxauth") return "ucx";
    return GetParam();
  }
  bool Authenticated() const { return GetParam() == "tls" || GetParam() == "ucxauth"; }
  // Sets the kind (and, for "tls" runs, the client's certificate).
  void ApplyKind(DataPlaneClientOptions* o) const {
    o->kind = Kind();
    if (Authenticated()) o->tls = TlsFiles().client;
  }

  void SetUp() override {
    if (Kind() == "ucx") {
      const std::string reason = UcxUnavailableReason();
      if (!reason.empty())
        GTEST_SKIP() << "UCX cannot create a context on this machine: " << reason;
    }
  }

  DataPlaneServerOptions ServerOptions() const {
    DataPlaneServerOptions o;
    o.kind = Kind();
    if (Authenticated()) o.tls = TlsFiles().server;
    return o;
  }
};

}  // namespace vc::transport::testing
