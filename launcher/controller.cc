#include "launcher/controller.h"

#include "launcher/controller_impl.h"

namespace keel {

Controller::Controller(ControllerOptions opts, RankHost* host, std::shared_ptr<Store> store,
                       ControlServer* server)
    : impl_(std::make_unique<Impl>(std::move(opts), host, std::move(store), server)) {}

Controller::~Controller() = default;

void Controller::set_agent_handler(
    std::function<void(const std::string&, const control::Envelope&)> fn) {
  impl_->on_agent = std::move(fn);
}

int Controller::run() {
  return impl_->run();
}

void Controller::pump() {
  impl_->pump();
}

int Controller::epoch() const {
  return impl_->epoch;
}

}  // namespace keel
