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

}  // namespace shardps

#endif  // SHARDPS_COMMON_PROTOCOL_H_
