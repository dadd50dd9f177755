# libddp example programs and ddp-reducer-bench.
add_executable(ddp-example-sum examples/sum.cpp)
target_link_libraries(ddp-example-sum PRIVATE ddp::runtime)
ddp_strict(ddp-example-sum)
