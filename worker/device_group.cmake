# DeviceGroup: the local first tier driven by the Worker (merge per partition,
# PushPullPartition, broadcast). Needs both shardps_local_tier and
# shardps_worker, so it is included at the end of worker/CMakeLists.txt, after
# shardps_worker is defined.
#
# Targets:
#   shardps_device_group        static library
#   shardps_device_group_test   GoogleTest binary (fake Worker, no cluster)

add_library(shardps_device_group STATIC ${CMAKE_CURRENT_LIST_DIR}/device_group.cc)
target_include_directories(shardps_device_group PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(shardps_device_group PUBLIC shardps_local_tier shardps_worker absl::time)

shardps_add_test(shardps_device_group_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/device_group_test.cc
  LIBS shardps_device_group)
