// ControlStore (c10d_backend.h): the control plane of a multi-process run on c10d's TCPStore.
// Its own file: it lives outside the process groups and knows no backend.

#include "harness/comm/c10d_backend.h"

#include <algorithm>
#include <chrono>
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
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    const std::string what = serve ? "serve the store on port " + std::to_string(port)
                                   : "reach the store at " + host + ":" + std::to_string(port);
    throw std::runtime_error("cannot " + what + ": " +
                             (dynamic_cast<const c10::Error*>(&e)
                                  ? static_cast<const c10::Error&>(e).what_without_backtrace()
                                  : e.what()));
  }
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
