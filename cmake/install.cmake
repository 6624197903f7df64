# What `cmake --install` puts under the prefix:
#   lib/libshardps.so*                the C ABI (worker/shared_library.cmake)
#   include/shardps/c_api.h           its header: #include "shardps/c_api.h"
#   bin/shardps                       the scheduler/server/tools command
#   lib/pkgconfig/shardps.pc          pkg-config --cflags --libs shardps
#   lib/cmake/ShardPS/                find_package(ShardPS) -> ShardPS::shardps
# The installed interface is the C ABI only, for C and C++ consumers alike: the
# C++ API (worker/worker.h) exposes protobuf and Abseil types whose ABI changes
# with their versions, so it is not a promise a shared library can keep; jobs
# that want it build inside this project and link the static libraries.
include(CMakePackageConfigHelpers)

set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ShardPS)
set(_pkgconfig_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(TARGETS shardps_shared EXPORT ShardPSTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS shardps RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/worker/c_api.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/shardps)

install(EXPORT ShardPSTargets NAMESPACE ShardPS:: DESTINATION ${_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ShardPSConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ShardPSConfig.cmake INSTALL_DESTINATION ${_cmake_dir})
# 0.x: a new minor version may break the ABI (the SONAME carries MAJOR.MINOR).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ShardPSConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ShardPSConfig.cmake ${PROJECT_BINARY_DIR}/ShardPSConfigVersion.cmake
        DESTINATION ${_cmake_dir})

# The .pc file finds the prefix from its own location, so the tree can be
# installed anywhere (`cmake --install build --prefix DIR`) or moved.
file(RELATIVE_PATH SHARDPS_PC_PREFIX_FROM_PCFILEDIR /prefix/${_pkgconfig_dir} /prefix)
configure_file(${CMAKE_CURRENT_LIST_DIR}/shardps.pc.in ${PROJECT_BINARY_DIR}/shardps.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/shardps.pc DESTINATION ${_pkgconfig_dir})
