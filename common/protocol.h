// Protocol constants shared by every node.
#ifndef SHARDPS_COMMON_PROTOCOL_H_
#define SHARDPS_COMMON_PROTOCOL_H_

#include <cstdint>

namespace shardps {

// Carried in registration and in every data-plane header; nodes with a
// different version are refused with a clear error. Bump on any wire change.
inline constexpr uint32_t kProtocolVersion = 1;

// Upper bound of one data-plane header frame; larger frames are rejected
// before parsing.
inline constexpr uint64_t kMaxHeaderBytes = 4096;

// One async push's share of a digest of the pushes a server applied (per
// partition and worker) and of those a worker was acknowledged: summed
// modulo 2^64, equal sums of equal counts mean the same pushes, where a
// count alone takes one push lost and another applied twice for none.
// SplitMix64's finalizer, so ids that differ by one differ in every bit.
inline constexpr uint64_t PushDigest(uint64_t request_id) {
  uint64_t z = request_id + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace shardps

#endif  // SHARDPS_COMMON_PROTOCOL_H_
