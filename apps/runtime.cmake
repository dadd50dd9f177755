# libddp example programs and ddp-reducer-bench.
add_executable(ddp-example-sum examples/sum.cpp)
target_link_libraries(ddp-example-sum PRIVATE ddp::runtime)
ddp_strict(ddp-example-sum)

# A complete training loop (docs/runtime.md walks through it).
add_executable(ddp-example-train examples/train_linear.cpp)
target_link_libraries(ddp-example-train PRIVATE ddp::runtime)
ddp_strict(ddp-example-train)

find_package(BLAS REQUIRED)
add_executable(ddp-reducer-bench reducer_bench.cpp)
target_link_libraries(ddp-reducer-bench PRIVATE ddp::runtime CLI11::CLI11 ${BLAS_LIBRARIES})
ddp_strict(ddp-reducer-bench)
# --record reads the collective record page it hands to libddp (the worker contract's layout).
target_include_directories(ddp-reducer-bench PRIVATE ${PROJECT_SOURCE_DIR}/common/include)
# ... and times libddp's internal recorder on its own (a benchmark, not a user of the API).
target_include_directories(ddp-reducer-bench PRIVATE ${PROJECT_SOURCE_DIR}/runtime)
