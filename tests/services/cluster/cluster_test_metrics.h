// Shared by the cluster suites that read a daemon's counters: its /metrics
// page, fetched over HTTP.
#pragma once

#include <string>

#include "common/http/httplib.h"
#include "gtest/gtest.h"

namespace vc::clustertest {

// The /metrics page served at `hostport` (empty, with a test failure, if the
// GET fails).
inline std::string MetricsPage(const std::string& hostport) {
  const size_t colon = hostport.rfind(':');
  httplib::Client client(hostport.substr(0, colon), std::stoi(hostport.substr(colon + 1)));
  client.set_read_timeout(10, 0);
  auto res = client.Get("/metrics");
  EXPECT_TRUE(res && res->status == 200) << "GET http://" << hostport << "/metrics";
  return res && res->status == 200 ? res->body : std::string();
}

}  // namespace vc::clustertest
