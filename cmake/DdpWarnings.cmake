# Warnings never break a user's build: our own code builds with -Wall -Wextra, and only with
# DDP_WERROR=ON (scripts/test turns it on) are they errors. A newer compiler or another
# optimisation level can report warnings (some of them false) that ours does not.
option(DDP_WERROR "Treat compiler warnings in our own code as errors" OFF)

# GCC 12 at -O3 reports -Wrestrict on ordinary std::string code ("p" + std::to_string(i)):
# a false positive in its inlined basic_string (GCC bug 105329). Off for GCC 12
# only; the Release build in scripts/test keeps every other warning an error.
set(DDP_GCC12_FALSE_WARNINGS "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  set(DDP_GCC12_FALSE_WARNINGS -Wno-restrict)
endif()

# ddp_strict(target): our own code builds with -Wall -Wextra (and -Werror under DDP_WERROR).
# CUDA sources get the same through nvcc: its own warnings, and the host compiler's.
function(ddp_strict target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra ${DDP_GCC12_FALSE_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(DDP_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
endfunction()
