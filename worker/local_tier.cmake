# Local first tier of the worker: Device abstraction (CPU / CUDA), LocalReducer
# (merge D device gradients into one host buffer, broadcast back) and its
# benchmark. Included from worker/CMakeLists.txt; depends on nothing else of
# the worker.
#
# Targets:
#   shardps_local_tier        static library (always built; CUDA parts linked
#                             in when SHARDPS_HAVE_CUDA, stubs otherwise)
#   shardps_local_tier_cuda   object library of the .cu files (CUDA builds only)
#   shardps_local_tier_test   GoogleTest binary (CUDA tests skip without a GPU)

set(_local_tier_dir ${CMAKE_CURRENT_LIST_DIR})

add_library(shardps_local_tier STATIC
  ${_local_tier_dir}/device.cc
  ${_local_tier_dir}/device_buffer.cc
  ${_local_tier_dir}/device_cpu.cc
  ${_local_tier_dir}/device_thread.cc
  ${_local_tier_dir}/local_bench.cc
  ${_local_tier_dir}/local_cpu_reducer.cc
  ${_local_tier_dir}/local_reducer.cc
  ${_local_tier_dir}/local_sum.cc
  ${_local_tier_dir}/local_thread_pool.cc)
target_include_directories(shardps_local_tier PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(shardps_local_tier PUBLIC
  absl::status absl::statusor absl::strings absl::str_format absl::synchronization absl::span
  absl::function_ref Threads::Threads)
# The sum kernel is the hot loop: let GCC vectorise and unroll it fully.
set_source_files_properties(${_local_tier_dir}/local_sum.cc PROPERTIES COMPILE_OPTIONS -O3)

if(SHARDPS_HAVE_CUDA)
  add_library(shardps_local_tier_cuda OBJECT
    ${_local_tier_dir}/device_cuda.cu
    ${_local_tier_dir}/local_cuda_reducer.cu)
  target_include_directories(shardps_local_tier_cuda PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(shardps_local_tier_cuda PUBLIC
    CUDA::cudart absl::status absl::statusor absl::strings absl::synchronization absl::span)
  target_compile_definitions(shardps_local_tier_cuda PUBLIC SHARDPS_WITH_CUDA=1)
  if(SHARDPS_HAVE_NCCL)
    target_include_directories(shardps_local_tier_cuda PRIVATE ${NCCL_INCLUDE_DIR})
    target_compile_definitions(shardps_local_tier_cuda PUBLIC SHARDPS_WITH_NCCL=1)
    target_compile_definitions(shardps_local_tier PUBLIC SHARDPS_WITH_NCCL=1)
    target_link_libraries(shardps_local_tier PUBLIC ${NCCL_LIBRARY})
  endif()
  target_sources(shardps_local_tier PRIVATE $<TARGET_OBJECTS:shardps_local_tier_cuda>)
  target_compile_definitions(shardps_local_tier PUBLIC SHARDPS_WITH_CUDA=1)
  target_link_libraries(shardps_local_tier PUBLIC CUDA::cudart)
else()
  target_sources(shardps_local_tier PRIVATE
    ${_local_tier_dir}/device_cuda_stub.cc
    ${_local_tier_dir}/local_cuda_reducer_stub.cc)
endif()

shardps_add_test(shardps_local_tier_test
  SOURCES ${_local_tier_dir}/device_test.cc
          ${_local_tier_dir}/local_reducer_test.cc
          ${_local_tier_dir}/local_cuda_reducer_test.cc
          ${_local_tier_dir}/local_bench_test.cc
  LIBS shardps_local_tier)

