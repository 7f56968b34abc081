#include "backend/multihost/alltoall_forms.h"

#include <stdexcept>

namespace hoccl {

AllToAllHostsForm alltoallChoice(const std::string& setting) {
  if (setting == "direct") return AllToAllHostsForm::Direct;
  if (setting == "rail") return AllToAllHostsForm::Relay;
  if (setting == "auto") return AllToAllHostsForm::Auto;
  throw std::invalid_argument("HOCCL_MULTIHOST_ALLTOALL=" + setting + ": expected auto, direct or rail");
}

}  // namespace hoccl
