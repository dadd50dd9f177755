# Installed package: headers, libraries, a CMake package (find_package(ddp)) and pkg-config.
# Filled in by the runtime packaging work; placeholder so the top level stays stable.
