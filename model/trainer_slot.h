// The buffers of one in-flight micro-batch: private to the Trainer's files (trainer.cc,
// trainer_check.cc).
#pragma once

#include "model/trainer.h"

namespace keel {

struct Trainer::Slot {
  Backend* backend;
  int32_t* tokens = nullptr;   // device
  int32_t* targets = nullptr;  // device
  float* input = nullptr;      // [B,T,C], from the previous stage
  float* activations = nullptr;
  explicit Slot(Backend* b) : backend(b) {}
  ~Slot() {
    for (void* p : {static_cast<void*>(tokens), static_cast<void*>(targets),
                    static_cast<void*>(input), static_cast<void*>(activations)})
      backend->free(p);
  }
};

}  // namespace keel
