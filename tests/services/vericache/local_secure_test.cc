// `vericache local` is secure by default (issue 11 item 6), checked on the
// real binary: the endpoints file (mode 0600) holds tls_ca, both tenants'
// API keys and the store's data plane; the CA and the daemons' certificates
// chain, with the SANs IP:127.0.0.1 and DNS:localhost; the client commands
// work with --endpoints-file and with --api-key/--tls-ca/VERICACHE_API_KEY,
// and fail with one line and exit code 1 without a key, with a wrong key, or
// in plaintext.
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/scratch_dir.h"
#include "tests/services/vericache/cli_runner.h"

namespace {

using vc::testing_cli::CountLines;
using vc::testing_cli::RunCli;
using vc::testing_cli::RunResult;

X509* LoadCert(const std::string& path) {
  FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr) return nullptr;
  X509* c = PEM_read_X509(f, nullptr, nullptr, nullptr);
  fclose(f);
  return c;
}

class LocalSecureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* d = std::getenv("VC_MODELS_DIR");
    model_ = std::string(d ? d : "") + "/stories260K.bin";
    if (!std::ifstream(model_).good()) return;
    scratch_ = new vc::test_support::ScratchDir("vc-local-secure-");
    dir_ = scratch_->path();
    endpoints_ = dir_ + "/endpoints.json";
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      const std::string out = dir_ + "/local.out";
      const std::string err = dir_ + "/local.err";
      if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
      execl(VC_CLI_PATH, VC_CLI_PATH, "local", "--model", model_.c_str(), "--worker-threads", "1",
            "--endpoints-file", endpoints_.c_str(), "--log-dir", dir_.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (std::chrono::steady_clock::now() < deadline) {
      if (std::ifstream(endpoints_).good()) {
        std::ifstream in(endpoints_);
        json_ = nlohmann::json::parse(in, nullptr, false);
        if (!json_.is_discarded()) return;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  static void TearDownTestSuite() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    delete scratch_;  // after `vericache local`, whose logs are in it
    scratch_ = nullptr;
  }
  void SetUp() override {
    if (!std::ifstream(model_).good()) GTEST_SKIP() << "test model not found (VC_MODELS_DIR)";
    ASSERT_TRUE(json_.is_object()) << "vericache local wrote no endpoints file; see " << dir_;
  }
  static inline vc::test_support::ScratchDir* scratch_ = nullptr;
  static inline std::string model_, dir_, endpoints_;
  static inline pid_t pid_ = -1;
  static inline nlohmann::json json_;
};

TEST_F(LocalSecureTest, EndpointsFileHoldsTheCredentialsPrivately) {
  struct stat st;
  ASSERT_EQ(stat(endpoints_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  for (const char* k : {"coordinator", "kvstore", "verifier", "drafter", "coordinator_metrics",
                        "kvstore_data", "tls_ca"}) {
    EXPECT_TRUE(json_.contains(k) && json_[k].is_string()) << k << " in " << json_.dump();
  }
  ASSERT_TRUE(json_["api_keys"].is_object());
  const std::string a = json_["api_keys"]["tenant-a"].get<std::string>();
  const std::string b = json_["api_keys"]["tenant-b"].get<std::string>();
  EXPECT_GE(a.size(), 16u);
  EXPECT_NE(a, b);
  // The keys are never printed or logged.
  std::stringstream logs;
  for (const char* f : {"/local.out", "/local.err", "/coordinator.log", "/kvstore.log"}) {
    logs << std::ifstream(dir_ + f).rdbuf();
  }
  EXPECT_EQ(logs.str().find(a), std::string::npos);
  EXPECT_EQ(logs.str().find(b), std::string::npos);
}

TEST_F(LocalSecureTest, CertificatesChainToTheCaWithLoopbackSans) {
  const std::string ca_path = json_["tls_ca"].get<std::string>();
  X509* ca = LoadCert(ca_path);
  ASSERT_NE(ca, nullptr);
  const std::string tls_dir = ca_path.substr(0, ca_path.rfind('/'));
  for (const char* name : {"daemon", "client"}) {
    SCOPED_TRACE(name);
    X509* cert = LoadCert(tls_dir + "/" + name + ".crt");
    ASSERT_NE(cert, nullptr);
    X509_STORE* store = X509_STORE_new();
    X509_STORE_add_cert(store, ca);
    X509_STORE_CTX* ctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(ctx, store, cert, nullptr);
    EXPECT_EQ(X509_verify_cert(ctx), 1)
        << X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx));
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    EXPECT_EQ(X509_check_host(cert, "localhost", 0, 0, nullptr), 1);
    EXPECT_EQ(X509_check_ip_asc(cert, "127.0.0.1", 0), 1);
    struct stat st;
    ASSERT_EQ(stat((tls_dir + "/" + name + ".key").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600);
    X509_free(cert);
  }
  X509_free(ca);
}

TEST_F(LocalSecureTest, ClientCommandsUseTheKeyAndRefuseWithout) {
  const std::string coord = json_["coordinator"].get<std::string>();
  const std::string ca = json_["tls_ca"].get<std::string>();
  const std::string key = json_["api_keys"]["tenant-a"].get<std::string>();
  const std::string gen = " --prompt-ids '1 306 461' --max-new-tokens 6 --ignore-eos --json";
  RunResult r = RunCli("client generate --endpoints-file " + endpoints_ + gen);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"].size(), 6u);
  r = RunCli("client generate --coordinator " + coord + " --tls-ca " + ca + " --api-key " + key +
             gen);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = RunCli("client status --coordinator " + coord + " --tls-ca " + ca,
             "VERICACHE_API_KEY=" + key);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // No key, a wrong key, plaintext: exit 1 and one line.
  for (const std::string& args :
       {"client generate --coordinator " + coord + " --tls-ca " + ca + gen,
        "client generate --coordinator " + coord + " --tls-ca " + ca + " --api-key " +
            std::string(24, 'x') + gen,
        "client status --coordinator " + coord + " --api-key " + key}) {
    SCOPED_TRACE(args);
    r = RunCli(args);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
  }
  r = RunCli("client generate --coordinator " + coord + " --tls-ca " + ca + gen);
  EXPECT_NE(r.err.find("API key"), std::string::npos) << r.err;
  // Ingest and prefix management as tenant-b, through the endpoints file.
  r = RunCli("ingest --endpoints-file " + endpoints_ + " --tenant tenant-b --prompt-ids '" +
             std::string("1 306 461 ") + [] {
               std::string s;
               for (int i = 0; i < 70; ++i) s += std::to_string(20 + i) + " ";
               return s;
             }() + "' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string id = nlohmann::json::parse(r.out)["prefix_id"].get<std::string>();
  // tenant-a cannot delete tenant-b's prefix; tenant-b can.
  r = RunCli("prefix delete --endpoints-file " + endpoints_ + " --prefix-id " + id);
  EXPECT_EQ(r.exit_code, 2) << r.err;  // NOT_FOUND, like an id nobody registered
  EXPECT_NE(r.err.find("not registered"), std::string::npos) << r.err;
  r = RunCli("prefix delete --endpoints-file " + endpoints_ + " --tenant tenant-b --prefix-id " + id);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
