// The "ucx" backend: UCP stream API over a sockaddr listener and
// client-server endpoints. One context and one MULTI-thread worker per
// process, shared by every server and client in it and progressed by its own
// thread that sleeps on the worker's event fd; connection threads post
// operations and wait on their completion with the caller's deadline. Every
// endpoint runs with UCP_ERR_HANDLING_MODE_PEER: the error callback marks the
// stream failed, which ends every wait on it.
//
// Buffers of posted operations belong to the operation (shared with its
// completion callback), never to the caller, so a wait that gives up (a
// deadline, a failed peer) cannot leave UCX writing into freed memory.
#include <arpa/inet.h>
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/transport/internal/backends.h"

namespace vc::transport::internal {
namespace {

// Largest single receive posted (bounds the per-operation buffer).
constexpr size_t kMaxRecvBytes = size_t{8} << 20;
// How long closing an endpoint may take before its request is abandoned.
constexpr auto kCloseWait = std::chrono::seconds(2);
// Connection requests waiting for Accept; more are rejected.
constexpr size_t kMaxPendingConnections = 64;

absl::Status UcxError(const std::string& what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// A UCP context and one worker with its progress thread.
//
// Why one per process: UCX 1.13 keeps fd event handlers in one process-wide
// table keyed by the fd number, and queues per worker the events it could
// not deliver while the worker was busy ("missed" events). When an fd of
// one worker is closed and its number reused by another worker's fd before
// the first worker replays its queue, the replay finds the other worker's
// handler and aborts the process (assertion `handler->async == async`; fixed
// upstream in UCX 1.17, openucx/ucx#9942). A server that closes connections
// while a client in the same process opens them hit it. With a single worker
// a reused number can only belong to the same worker, where a replayed event
// is merely spurious (UCX's handlers read non-blocking).
class UcxWorker {
 public:
  // The process's worker: the live one, or a new one once the last user of
  // the previous one has released it (never two at a time).
  static absl::StatusOr<std::shared_ptr<UcxWorker>> Shared() {
    ProcessWorker& pw = ProcessWorker::Get();
    std::unique_lock<std::mutex> lock(pw.mu);
    while (true) {
      if (std::shared_ptr<UcxWorker> live = pw.current.lock()) return live;
      if (pw.alive == nullptr) break;
      pw.destroyed.wait(lock);  // the last user is destroying it
    }
    absl::StatusOr<UcxWorker*> created = Create();
    if (!created.ok()) return created.status();
    pw.alive = *created;
    std::shared_ptr<UcxWorker> w(*created, [](UcxWorker* dying) {
      ProcessWorker& p = ProcessWorker::Get();
      std::lock_guard<std::mutex> hold(p.mu);
      delete dying;
      p.alive = nullptr;
      p.destroyed.notify_all();
    });
    pw.current = w;
    return w;
  }

  ~UcxWorker() {
    if (thread_.joinable()) {
      stop_.store(true);
      ucp_worker_signal(worker_);
      thread_.join();
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  ucp_worker_h get() const { return worker_; }
  // Wakes the progress thread after an operation was posted.
  void Wake() { ucp_worker_signal(worker_); }

 private:
  struct ProcessWorker {
    std::mutex mu;
    std::condition_variable destroyed;
    std::weak_ptr<UcxWorker> current;  // guarded by mu
    UcxWorker* alive = nullptr;        // guarded by mu; set until deleted
    static ProcessWorker& Get() {
      static auto* const process_worker = new ProcessWorker();  // never destroyed
      return *process_worker;
    }
  };

  UcxWorker() = default;

  static absl::StatusOr<UcxWorker*> Create() {
    std::unique_ptr<UcxWorker> w(new UcxWorker());
    ucp_config_t* config = nullptr;
    // Reads UCX_* from the environment; what it sets is never overridden.
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return UcxError("UCX config", st);
    if (std::getenv("UCX_TCP_CM_REUSEADDR") == nullptr) {
      // A restarted server must be able to bind its port again while old
      // connections linger in TIME_WAIT. The tcp connection manager reads it
      // as "CM_REUSEADDR" (UCX 1.13).
      (void)ucp_config_modify(config, "CM_REUSEADDR", "y");  // best effort
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &w->context_);
    ucp_config_release(config);
    if (st != UCS_OK) return UcxError("UCX context", st);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    st = ucp_worker_create(w->context_, &wp, &w->worker_);
    if (st != UCS_OK) return UcxError("UCX worker", st);
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    st = ucp_worker_query(w->worker_, &attr);
    if (st != UCS_OK || attr.thread_mode != UCS_THREAD_MODE_MULTI) {
      return absl::UnavailableError("this UCX build has no multi-threaded worker support");
    }
    if (ucp_worker_get_efd(w->worker_, &w->efd_) != UCS_OK) w->efd_ = -1;
    w->thread_ = std::thread([raw = w.get()] { raw->ProgressLoop(); });
    return w.release();
  }

  void ProgressLoop() {
    while (!stop_.load()) {
      while (ucp_worker_progress(worker_) != 0) {
      }
      if (efd_ < 0) {  // no event fd: poll the worker every 100 us
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      const ucs_status_t st = ucp_worker_arm(worker_);
      if (st == UCS_ERR_BUSY) continue;
      pollfd p{efd_, POLLIN, 0};
      ::poll(&p, 1, st == UCS_OK ? 100 : 1);
    }
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// State shared by a stream, its in-flight operations and its error callback.
struct StreamSync {
  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;
  ucs_status_t fail_status = UCS_OK;
};

struct Op {
  std::shared_ptr<StreamSync> sync;
  bool done = false;  // guarded by sync->mu
  ucs_status_t status = UCS_OK;
  size_t length = 0;
  std::string buffer;
};

void Complete(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* holder = static_cast<std::shared_ptr<Op>*>(user_data);
  std::shared_ptr<Op> op = std::move(*holder);
  delete holder;
  {
    std::lock_guard<std::mutex> lock(op->sync->mu);
    op->done = true;
    op->status = status;
    op->length = length;
  }
  op->sync->cv.notify_all();
  ucp_request_free(request);
}

void OnSend(void* request, ucs_status_t status, void* user_data) {
  Complete(request, status, 0, user_data);
}

void OnRecv(void* request, ucs_status_t status, size_t length, void* user_data) {
  Complete(request, status, length, user_data);
}

void OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  StreamSync& sync = **static_cast<std::shared_ptr<StreamSync>*>(arg);
  {
    std::lock_guard<std::mutex> lock(sync.mu);
    sync.failed = true;
    if (sync.fail_status == UCS_OK) sync.fail_status = status;
  }
  sync.cv.notify_all();
}

class UcxStream : public ByteStream {
 public:
  // `params` says how to reach the peer (sockaddr or a connection request);
  // the error handling fields are filled in here.
  static absl::StatusOr<std::unique_ptr<ByteStream>> Create(std::shared_ptr<UcxWorker> worker,
                                                            ucp_ep_params_t params) {
    std::unique_ptr<UcxStream> s(new UcxStream(std::move(worker)));
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &OnEpError;
    params.err_handler.arg = s->err_arg_;
    const ucs_status_t st = ucp_ep_create(s->worker_->get(), &params, &s->ep_);
    if (st != UCS_OK) {
      s->closed_ = true;  // nothing to close
      return UcxError("UCX endpoint", st);
    }
    return std::unique_ptr<ByteStream>(std::move(s));
  }

  ~UcxStream() override {
    Close();
    // After a completed close UCX calls no more callbacks for the endpoint;
    // otherwise the callback argument is left alive on purpose.
    if (close_completed_) delete err_arg_;
  }

  absl::StatusOr<size_t> ReadSome(char* buf, size_t max, TimePoint deadline) override {
    if (max == 0) return size_t{0};
    auto op = std::make_shared<Op>();
    op->sync = sync_;
    op->buffer.resize(std::min(max, kMaxRecvBytes));
    while (true) {
      {
        std::lock_guard<std::mutex> lock(ep_mu_);
        if (absl::Status s = Usable(); !s.ok()) return s;
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.recv_stream = &OnRecv;
        auto* holder = new std::shared_ptr<Op>(op);
        p.user_data = holder;
        size_t length = 0;
        ucs_status_ptr_t r =
            ucp_stream_recv_nbx(ep_, op->buffer.data(), op->buffer.size(), &length, &p);
        if (r == nullptr) {  // completed at once; no callback
          delete holder;
          op->done = true;
          op->length = length;
        } else if (UCS_PTR_IS_ERR(r)) {
          delete holder;
          return UcxError("UCX stream receive", UCS_PTR_STATUS(r));
        }
      }
      if (absl::Status s = Wait(*op, deadline); !s.ok()) return s;
      if (op->length > 0) break;
      op->done = false;  // an empty completion: post again
    }
    std::memcpy(buf, op->buffer.data(), op->length);
    return op->length;  // UCX's own count: the completion's length
  }

  absl::Status Write(std::string data, TimePoint deadline) override {
    if (data.empty()) return absl::OkStatus();
    auto op = std::make_shared<Op>();
    op->sync = sync_;
    op->buffer = std::move(data);
    {
      std::lock_guard<std::mutex> lock(ep_mu_);
      if (absl::Status s = Usable(); !s.ok()) return s;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &OnSend;
      auto* holder = new std::shared_ptr<Op>(op);
      p.user_data = holder;
      ucs_status_ptr_t r = ucp_stream_send_nbx(ep_, op->buffer.data(), op->buffer.size(), &p);
      if (r == nullptr) {  // completed at once; no callback
        delete holder;
        CountSent(op->buffer.size());
        return absl::OkStatus();
      }
      if (UCS_PTR_IS_ERR(r)) {
        delete holder;
        return UcxError("UCX stream send", UCS_PTR_STATUS(r));
      }
    }
    absl::Status done = Wait(*op, deadline);
    // A stream send completes whole: UCX reported the buffer sent.
    if (done.ok()) CountSent(op->buffer.size());
    return done;
  }

  std::string PeerAddress() const override { return peer_address_; }
  void set_peer_address(std::string address) { peer_address_ = std::move(address); }

  void Close() override {
    std::lock_guard<std::mutex> lock(ep_mu_);
    if (closed_) return;
    closed_ = true;
    {
      std::lock_guard<std::mutex> sync_lock(sync_->mu);
      sync_->failed = true;
      if (sync_->fail_status == UCS_OK) sync_->fail_status = UCS_ERR_CANCELED;
    }
    sync_->cv.notify_all();
    // FORCE: no handshake with a peer that may be gone; in-flight operations
    // complete with UCS_ERR_CANCELED, the peer sees its endpoint fail.
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &p);
    worker_->Wake();
    if (!UCS_PTR_IS_PTR(r)) {
      close_completed_ = true;
      return;
    }
    const auto give_up = Clock::now() + kCloseWait;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    close_completed_ = ucp_request_check_status(r) != UCS_INPROGRESS;
    ucp_request_free(r);
  }

 private:
  explicit UcxStream(std::shared_ptr<UcxWorker> worker)
      : worker_(std::move(worker)),
        sync_(std::make_shared<StreamSync>()),
        err_arg_(new std::shared_ptr<StreamSync>(sync_)) {}

  // Called with ep_mu_ held.
  absl::Status Usable() {
    if (closed_) return absl::UnavailableError("data plane connection closed");
    std::lock_guard<std::mutex> lock(sync_->mu);
    if (sync_->failed) return UcxError("UCX data plane peer failed", sync_->fail_status);
    return absl::OkStatus();
  }

  // Waits for `op` (posted, or already done), the stream failing, or the
  // deadline; a deadline closes the stream (its framing is out of step).
  absl::Status Wait(Op& op, TimePoint deadline) {
    worker_->Wake();
    std::unique_lock<std::mutex> lock(sync_->mu);
    auto ready = [&] { return op.done || sync_->failed; };
    if (deadline == kNoDeadline) {
      sync_->cv.wait(lock, ready);
    } else if (!sync_->cv.wait_until(lock, deadline, ready)) {
      lock.unlock();
      Close();
      return absl::DeadlineExceededError("UCX data plane transfer passed its deadline");
    }
    if (op.done && op.status == UCS_OK) return absl::OkStatus();
    const ucs_status_t st = op.done ? op.status : sync_->fail_status;
    return UcxError("UCX data plane peer failed", st);
  }

  std::shared_ptr<UcxWorker> worker_;
  std::shared_ptr<StreamSync> sync_;
  std::shared_ptr<StreamSync>* err_arg_;  // the error callback's argument
  std::mutex ep_mu_;                      // posting vs closing
  ucp_ep_h ep_ = nullptr;
  bool closed_ = false;
  bool close_completed_ = false;
  std::string peer_address_;  // server side: the client's IP address
};

// Connection requests from the listener callback, waiting for Accept.
struct PendingConnections {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ucp_conn_request_h> queue;
  ucp_listener_h listener = nullptr;
  bool closing = false;
};

void OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* pending = static_cast<PendingConnections*>(arg);
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    if (!pending->closing && pending->queue.size() < kMaxPendingConnections) {
      pending->queue.push_back(request);
      pending->cv.notify_one();
      return;
    }
  }
  if (pending->listener != nullptr) ucp_listener_reject(pending->listener, request);
}

class UcxListener : public Listener {
 public:
  UcxListener(std::shared_ptr<UcxWorker> worker, std::unique_ptr<PendingConnections> pending,
              std::string address)
      : worker_(std::move(worker)), pending_(std::move(pending)), address_(std::move(address)) {}

  ~UcxListener() override {
    std::deque<ucp_conn_request_h> left;
    {
      std::lock_guard<std::mutex> lock(pending_->mu);
      pending_->closing = true;
      left.swap(pending_->queue);
    }
    for (ucp_conn_request_h r : left) ucp_listener_reject(pending_->listener, r);
    ucp_listener_destroy(pending_->listener);
  }

  absl::StatusOr<std::unique_ptr<ByteStream>> Accept(std::chrono::milliseconds wait) override {
    ucp_conn_request_h request = nullptr;
    {
      std::unique_lock<std::mutex> lock(pending_->mu);
      if (!pending_->cv.wait_for(lock, wait, [&] { return !pending_->queue.empty(); })) {
        return std::unique_ptr<ByteStream>();
      }
      request = pending_->queue.front();
      pending_->queue.pop_front();
    }
    // The client's IP address (the owner of what it opens, until the data
    // plane authenticates peers).
    std::string peer;
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK &&
        attr.client_address.ss_family == AF_INET) {
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(&attr.client_address);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) peer = text;
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    auto stream = UcxStream::Create(worker_, params);
    if (stream.ok()) static_cast<UcxStream*>(stream->get())->set_peer_address(std::move(peer));
    return stream;
  }

  std::string address() const override { return address_; }

 private:
  std::shared_ptr<UcxWorker> worker_;
  std::unique_ptr<PendingConnections> pending_;
  const std::string address_;
};

class UcxConnector : public Connector {
 public:
  UcxConnector(std::shared_ptr<UcxWorker> worker, sockaddr_in addr)
      : worker_(std::move(worker)), addr_(addr) {}

  absl::StatusOr<std::unique_ptr<ByteStream>> Connect(TimePoint /*deadline*/) override {
    // Connection setup is asynchronous: a refused or unreachable server
    // fails the endpoint, and the first read or write reports it.
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr_);
    params.sockaddr.addrlen = sizeof(addr_);
    return UcxStream::Create(worker_, params);
  }

 private:
  std::shared_ptr<UcxWorker> worker_;
  const sockaddr_in addr_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> MakeUcxListener(const DataPlaneServerOptions& options) {
  auto hp = ParseHostPort(options.listen);
  if (!hp.ok()) return hp.status();
  auto addr = ResolveIpv4(*hp);
  if (!addr.ok()) return addr.status();
  auto worker = UcxWorker::Shared();
  if (!worker.ok()) return worker.status();
  auto pending = std::make_unique<PendingConnections>();
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  params.sockaddr.addrlen = sizeof(*addr);
  params.conn_handler.cb = &OnConnRequest;
  params.conn_handler.arg = pending.get();
  ucp_listener_h listener = nullptr;
  ucs_status_t st = ucp_listener_create((*worker)->get(), &params, &listener);
  if (st != UCS_OK) {
    return UcxError(absl::StrCat("UCX data plane cannot listen on ", options.listen), st);
  }
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    pending->listener = listener;
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  int port = hp->port;
  if (ucp_listener_query(listener, &attr) == UCS_OK && attr.sockaddr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  }
  return std::unique_ptr<Listener>(
      new UcxListener(*std::move(worker), std::move(pending), absl::StrCat(hp->host, ":", port)));
}

absl::StatusOr<std::unique_ptr<Connector>> MakeUcxConnector(const DataPlaneClientOptions& options) {
  auto hp = ParseHostPort(options.server_address);
  if (!hp.ok()) return hp.status();
  auto addr = ResolveIpv4(*hp);
  if (!addr.ok()) return addr.status();
  auto worker = UcxWorker::Shared();
  if (!worker.ok()) return worker.status();
  return std::unique_ptr<Connector>(new UcxConnector(*std::move(worker), *addr));
}

}  // namespace vc::transport::internal
