# Debian packages with CPack (docs/install.md says why two and what each holds):
#   ddprun      ddprun and ddpstore (install component "ddprun")
#   libddp-dev  static libraries, headers, find_package(ddp), ddp.pc (install component "dev")
#
#   cpack --config build/CPackConfig.cmake -B dist     # after the libraries and programs are built
#
# scripts/package builds them from a Release build without CUDA, with DDP_PORTABLE=ON and
# against Debian 11's glibc 2.31 (the sysroot of cmake/DdpSysroot.cmake), so that the programs
# need only glibc 2.31 or newer from the host. Run-time dependencies of the programs come from dpkg-shlibdeps (the
# libraries they load and the symbols they take, read from the binaries), which reads the
# symbols files of the glibc built against: the sysroot's dpkg database when there is one (this
# host's libc6 would ask for its own minimum versions, 2.34 for sysconf, whatever the program
# was built against). The -dev package's are what its CMake package finds when a user's project
# links libddp, and what the static libraries need when linked.
if(DDP_HAVE_CUDA)
  message(STATUS "ddp: this build links CUDA/NCCL from ${CUDAToolkit_LIBRARY_DIR}: its libddp-dev "
                 "package needs that toolkit on the target machine (scripts/package builds "
                 "with -DDDP_WITH_CUDA=OFF)")
endif()

# cpack (and `make install`) take what is built, as `cmake --install` does, instead of building
# every target first (the tests and benchmarks are not packaged): build the packaged targets
# before (scripts/package builds only those).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VENDOR "ddprun")
set(CPACK_PACKAGE_CONTACT "ddprun maintainers <ddprun@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_STRIP_FILES ON)  # programs only: static libraries are not stripped
set(CPACK_COMPONENTS_ALL ddprun dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # NAME_VERSION-RELEASE_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)

set(CPACK_DEBIAN_DDPRUN_PACKAGE_NAME ddprun)
set(CPACK_DEBIAN_DDPRUN_PACKAGE_SECTION utils)
string(CONCAT CPACK_DEBIAN_DDPRUN_DESCRIPTION
  "torchrun-compatible launcher and elastic agent for data-parallel training\n"
  "ddprun starts and supervises the workers of a PyTorch or libddp job as torchrun\n"
  "does (same options, same worker environment), with c10d, static and etcd\n"
  "rendezvous. ddpstore is the c10d-compatible TCP store on its own.")
set(CPACK_DEBIAN_DDPRUN_PACKAGE_SHLIBDEPS ON)  # Depends: from the binaries' NEEDED entries
if(CMAKE_SYSROOT AND EXISTS "${CMAKE_SYSROOT}/var/lib/dpkg/status")
  # Read by cmake/DdpCPackProject.cmake when cpack runs: dpkg-shlibdeps's database.
  set(CPACK_DDP_DPKG_ADMINDIR "${CMAKE_SYSROOT}/var/lib/dpkg")
  set(CPACK_PROJECT_CONFIG_FILE "${PROJECT_SOURCE_DIR}/cmake/DdpCPackProject.cmake")
endif()
set(CPACK_DEBIAN_DDPRUN_PACKAGE_SUGGESTS "python3-torch, etcd-server")
# Removes the probe's byte-code that a worker run as root leaves beside it.
set(CPACK_DEBIAN_DDPRUN_PACKAGE_CONTROL_EXTRA "${PROJECT_SOURCE_DIR}/packaging/debian/prerm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddp-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
string(CONCAT CPACK_DEBIAN_DEV_DESCRIPTION
  "libddp: C++20 data-parallel training runtime (static libraries, headers)\n"
  "Communicators bootstrapped from the launcher's store (Gloo on CPU), bucketed\n"
  "gradient all-reduce overlapping backward, a distributed sampler and the c10d\n"
  "store client; find_package(ddp) and pkg-config ddp.")
# What ddpConfig.cmake finds (Boost headers, Gloo, OpenSSL for ddp::etcd, Threads) and the
# headers the public headers include (Boost.Asio); the OpenSSL and the C++ runtime that the
# static libraries were compiled for: linked with an older libstdc++ (another distribution's
# GCC) they lack its symbols, so apt refuses the package there (Debian 11: docs/install.md).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libboost-dev (>= 1.74), libgloo-dev")
string(REGEX MATCH "^[0-9]+" _ddp_openssl_major "${OPENSSL_VERSION}")
string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libssl-dev (>= ${_ddp_openssl_major})")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  string(REGEX MATCH "^[0-9]+" _ddp_gcc_major "${CMAKE_CXX_COMPILER_VERSION}")
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libstdc++6 (>= ${_ddp_gcc_major})")
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "ddprun (= ${PROJECT_VERSION}-1), cmake (>= 3.20), pkg-config")

include(CPack)
cpack_add_component(ddprun DISPLAY_NAME "ddprun and ddpstore")
cpack_add_component(dev DISPLAY_NAME "libddp development files")
