// An in-process gRPC server for a test: plaintext, on a free port of
// 127.0.0.1, serving one service.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace vc::test_support {

struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;  // null if it could not start
  int port = 0;                          // 0 if no port was bound
  std::string address;                   // "127.0.0.1:<port>"
};

inline LoopbackServer ServeOnLoopback(grpc::Service* service) {
  LoopbackServer s;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &s.port);
  builder.RegisterService(service);
  s.server = builder.BuildAndStart();
  s.address = "127.0.0.1:" + std::to_string(s.port);
  return s;
}

}  // namespace vc::test_support
