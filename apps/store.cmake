# ddpstore and ddpstore-bench
add_executable(ddpstore ddpstore.cpp)
target_link_libraries(ddpstore PRIVATE ddp::rendezvous CLI11::CLI11)
ddp_strict(ddpstore)

add_executable(ddpstore-bench ddpstore_bench.cpp bench_floor_server.cpp)
target_link_libraries(ddpstore-bench PRIVATE ddp::rendezvous CLI11::CLI11)
ddp_strict(ddpstore-bench)
