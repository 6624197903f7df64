// The invariant every partition-engine harness checks on an answer to a
// worker: a RESPONSE, and an uncompressed OK answer's payload holds the
// num_elements floats its header says.
#ifndef SHARDPS_TESTS_FUZZ_ENGINE_ANSWER_H_
#define SHARDPS_TESTS_FUZZ_ENGINE_ANSWER_H_

#include <zmq.hpp>

#include "proto/data.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace shardps::fuzz {

inline void CheckAnswer(const DataHeader& answer, const zmq::message_t* payload) {
  Require(answer.op() == RESPONSE, "an answer to a worker is not a RESPONSE");
  if (payload != nullptr && answer.codec().empty() && answer.status_code() == 0) {
    Require(payload->size() == answer.num_elements() * sizeof(float),
            "an uncompressed answer's payload does not hold num_elements floats");
  }
}

}  // namespace shardps::fuzz

#endif  // SHARDPS_TESTS_FUZZ_ENGINE_ANSWER_H_
