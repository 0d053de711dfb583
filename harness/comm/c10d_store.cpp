// ControlStore (c10d_backend.h): the control plane of a multi-process run on c10d's TCPStore.
// Its own file: it lives outside the process groups and knows no backend.

#include "harness/comm/c10d_backend.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "harness/comm/c10d_internal.h"

namespace sb::harness {
namespace {

std::string bytesToString(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> stringToBytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

ControlStore::ControlStore(const std::string& host, int port, bool serve,
                           std::chrono::milliseconds timeout, std::string prefix)
    : impl_(std::make_unique<Impl>()) {
  impl_->prefix = std::move(prefix);
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = serve;
  o.waitWorkers = false;
  o.timeout = timeout;
  const std::string what = serve ? "serve the store on port " + std::to_string(port)
                                 : "reach the store at " + host + ":" + std::to_string(port);
  const auto text = [](const std::exception& e) -> std::string {
    const auto* c = dynamic_cast<const c10::Error*>(&e);
    return c ? c->what_without_backtrace() : e.what();
  };
  if (serve) {
    try {
      impl_->store = c10::make_intrusive<c10d::TCPStore>(host, o);
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot " + what + ": " + text(e));
    }
    return;
  }
  // A client connects and asks once, under the deadline: a program that accepts the connection
  // and never answers (another service on the port, a stopped master) blocks TCPStore's own
  // handshake and requests in a read without a timeout. The attempt runs on a thread of its
  // own, which is left behind blocked where the deadline passes (the run ends on the error).
  struct Attempt {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::string error;
  };
  const auto attempt = std::make_shared<Attempt>();
  std::thread([attempt, host, o, text] {
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::string error;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(host, o);
      (void)store->check({"sb/reachable"});
    } catch (const std::exception& e) {
      error = text(e);
    }
    const std::lock_guard<std::mutex> lock(attempt->m);
    attempt->store = std::move(store);
    attempt->error = std::move(error);
    attempt->done = true;
    attempt->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(attempt->m);
  // TCPStore retries its connect until `timeout`; a second of slack lets it say so first.
  if (!attempt->cv.wait_for(lock, timeout + std::chrono::seconds(1),
                            [&] { return attempt->done; })) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", static_cast<double>(timeout.count()) / 1000.0);
    throw std::runtime_error("cannot " + what + ": no store answered within " + secs +
                             " s (--timeout): is another program listening on that port, or "
                             "is rank 0 stopped?");
  }
  if (!attempt->error.empty()) throw std::runtime_error("cannot " + what + ": " + attempt->error);
  impl_->store = std::move(attempt->store);
}

ControlStore::~ControlStore() = default;

int ControlStore::port() const { return impl_->store->getPort(); }
const std::string& ControlStore::prefix() const { return impl_->prefix; }

void ControlStore::set(const std::string& key, const std::string& value) {
  impl_->store->set(impl_->prefix + key, stringToBytes(value));
}

std::optional<std::string> ControlStore::get(const std::string& key) {
  if (!impl_->store->check({impl_->prefix + key})) return std::nullopt;
  return bytesToString(impl_->store->get(impl_->prefix + key));
}

int64_t ControlStore::add(const std::string& key, int64_t value) {
  return impl_->store->add(impl_->prefix + key, value);
}

std::optional<std::string> ControlStore::waitFor(const std::string& key, Clock::time_point deadline,
                                                 const std::function<bool()>& giveUp) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (auto v = get(key)) return v;
    if (Clock::now() >= deadline || (giveUp && giveUp())) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace sb::harness
