# ddp_strict(target): our own code builds with -Wall -Wextra -Werror.
function(ddp_strict target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
endfunction()
