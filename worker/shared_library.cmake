# libshardps.so: the C ABI (c_api.h) with the worker library and everything it
# needs from this project inside, for jobs that load the worker at run time
# (Python ctypes, a PyTorch process). Included from worker/CMakeLists.txt
# after shardps_worker is defined.
#
# Targets:
#   shardps_shared   shared library, file libshardps.so.MAJOR.MINOR.PATCH,
#                    SONAME libshardps.so.MAJOR.MINOR (0.x releases may break
#                    the ABI at a minor version), exported as ShardPS::shardps
#
# Only the shardps_* C functions are exported (c_api.map): the project's C++
# classes, its generated protobuf messages and any inlined Abseil/protobuf code
# stay local, so nothing in the library can clash with, or be interposed by,
# another copy of those libraries in the host process. Abseil, protobuf, gRPC,
# glog and ZeroMQ themselves are the system's shared libraries (DT_NEEDED).

add_library(shardps_shared SHARED ${CMAKE_CURRENT_LIST_DIR}/c_api.cc)
set_target_properties(shardps_shared PROPERTIES
  OUTPUT_NAME shardps
  EXPORT_NAME shardps
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/c_api.map)
# The archive copy of c_api.o is never pulled: this target compiles its own.
target_link_libraries(shardps_shared PRIVATE shardps_worker)
target_link_options(shardps_shared PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/c_api.map")
# In sanitizer trees the runtime comes with the executable that loads the .so.
if(NOT SHARDPS_SANITIZE)
  target_link_options(shardps_shared PRIVATE LINKER:--no-undefined)
endif()
target_include_directories(shardps_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# Every project library linked into the .so must be position-independent
# (Debian's default PIE code uses TLS models a shared library cannot hold).
# Only those get -fPIC; the server and scheduler keep their PIE code.
function(shardps_make_pic target)
  get_target_property(_pic ${target} POSITION_INDEPENDENT_CODE)
  if(_pic)
    return()
  endif()
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  get_target_property(_deps ${target} LINK_LIBRARIES)
  foreach(_dep IN LISTS _deps)
    if(TARGET ${_dep})
      get_target_property(_imported ${_dep} IMPORTED)
      if(NOT _imported)
        shardps_make_pic(${_dep})
      endif()
    endif()
  endforeach()
endfunction()
shardps_make_pic(shardps_worker)
