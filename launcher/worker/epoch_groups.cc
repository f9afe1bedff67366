#include "launcher/worker/epoch_groups.h"

namespace keel {

void EpochGroups::abort() {
  cancel_ = true;
  std::lock_guard<std::mutex> l(mu_);
  if (groups_) groups_->abort_all();
}

ProcessGroups& EpochGroups::build(const Make& make, const std::function<void(ProcessGroups&)>& wrap,
                                  const std::function<void(ProcessGroups*)>& rebind) {
  auto groups = std::make_unique<ProcessGroups>(make(&cancel_));
  if (wrap) wrap(*groups);
  std::lock_guard<std::mutex> l(mu_);
  if (rebind) rebind(groups.get());
  groups_ = std::move(groups);
  return *groups_;
}

}  // namespace keel
