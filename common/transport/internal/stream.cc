#include "common/transport/internal/stream.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vc::transport::internal {

BufferedReader::BufferedReader(ByteStream* stream, std::atomic<int64_t>* received,
                               size_t buffer_bytes)
    : stream_(stream), shared_received_(received), buffer_(buffer_bytes, '\0') {}

absl::Status BufferedReader::ReadExact(char* dst, size_t n, TimePoint deadline) {
  while (n > 0) {
    if (begin_ < end_) {
      const size_t take = std::min(n, end_ - begin_);
      if (dst != nullptr) {
        std::memcpy(dst, buffer_.data() + begin_, take);
        dst += take;
      }
      begin_ += take;
      n -= take;
      continue;
    }
    absl::StatusOr<size_t> got;
    if (dst != nullptr && n >= buffer_.size()) {
      got = stream_->ReadSome(dst, n, deadline);
      if (!got.ok()) return got.status();
      dst += *got;
      n -= *got;
    } else {
      got = stream_->ReadSome(buffer_.data(), buffer_.size(), deadline);
      if (!got.ok()) return got.status();
      begin_ = 0;
      end_ = *got;
    }
    received_ += static_cast<int64_t>(*got);
    if (shared_received_ != nullptr) shared_received_->fetch_add(static_cast<int64_t>(*got));
  }
  return absl::OkStatus();
}

absl::Status BufferedReader::Skip(size_t n, TimePoint deadline) {
  return ReadExact(nullptr, n, deadline);
}

absl::Status BufferedReader::Fill(TimePoint deadline) {
  if (begin_ < end_) return absl::OkStatus();
  absl::StatusOr<size_t> got = stream_->ReadSome(buffer_.data(), buffer_.size(), deadline);
  if (!got.ok()) return got.status();
  begin_ = 0;
  end_ = *got;
  received_ += static_cast<int64_t>(*got);
  if (shared_received_ != nullptr) shared_received_->fetch_add(static_cast<int64_t>(*got));
  return absl::OkStatus();
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not HOST:PORT"));
  }
  HostPort hp;
  hp.host = address.substr(0, colon);
  if (hp.host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "': only IPv4 addresses and host names are supported"));
  }
  if (!absl::SimpleAtoi(address.substr(colon + 1), &hp.port) || hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' has no valid port (0..65535)"));
  }
  return hp;
}

absl::StatusOr<sockaddr_in> ResolveIpv4(const HostPort& hp) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(hp.port));
  if (inet_pton(AF_INET, hp.host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(hp.host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host '", hp.host, "': ", gai_strerror(rc)));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr;
  freeaddrinfo(result);
  return addr;
}

TimePoint DeadlineAfter(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace vc::transport::internal
