// The CUDA entry points of runtime/backend.h for a build without CUDA (KEEL_CUDA=OFF or no
// nvcc): the backend never exists, and asking for it says why.
#include "runtime/backend.h"
#include "runtime/check.h"

namespace keel {

bool cuda_available() {
  return false;
}

int cuda_device_count() {
  return 0;
}

std::unique_ptr<Backend> make_cuda_backend(int /*device*/, Precision /*precision*/) {
  throw Error("keel was built without CUDA");
}

}  // namespace keel
