# Warnings never break a user's build: our own code builds with -Wall -Wextra, and only with
# DDP_WERROR=ON (scripts/test turns it on) are they errors. A newer compiler or another
# optimisation level can report warnings (some of them false) that ours does not.
option(DDP_WERROR "Treat compiler warnings in our own code as errors" OFF)

# ddp_strict(target): our own code builds with -Wall -Wextra (and -Werror under DDP_WERROR).
function(ddp_strict target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(DDP_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
