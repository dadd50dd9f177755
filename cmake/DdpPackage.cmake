# Debian packages with CPack (docs/install.md says why two and what each holds):
#   ddprun      ddprun and ddpstore (install component "ddprun")
#   libddp-dev  static libraries, headers, find_package(ddp), ddp.pc (install component "dev")
#
#   cpack --config build/CPackConfig.cmake -B dist     # after the libraries and programs are built
#
# scripts/package builds them from a Release build without CUDA and with DDP_PORTABLE=ON, so
# the programs need only glibc from the host. Run-time dependencies of the programs come from
# dpkg-shlibdeps (the libraries they load, read from the binaries); the -dev package's are what
# its CMake package finds when a user's project links libddp.
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
set(CPACK_DEBIAN_DDPRUN_PACKAGE_SUGGESTS "python3-torch, etcd-server")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddp-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
string(CONCAT CPACK_DEBIAN_DEV_DESCRIPTION
  "libddp: C++20 data-parallel training runtime (static libraries, headers)\n"
  "Communicators bootstrapped from the launcher's store (Gloo on CPU), bucketed\n"
  "gradient all-reduce overlapping backward, a distributed sampler and the c10d\n"
  "store client; find_package(ddp) and pkg-config ddp.")
# What ddpConfig.cmake finds (Boost headers, Gloo, OpenSSL for ddp::etcd, Threads) and the
# headers the public headers include (Boost.Asio).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libboost-dev (>= 1.74), libgloo-dev, libssl-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "ddprun (= ${PROJECT_VERSION}-1), cmake (>= 3.20), pkg-config")

include(CPack)
cpack_add_component(ddprun DISPLAY_NAME "ddprun and ddpstore")
cpack_add_component(dev DISPLAY_NAME "libddp development files")
