# ddpstore and ddpstore-bench
add_executable(ddpstore ddpstore.cpp)
target_link_libraries(ddpstore PRIVATE ddp::store CLI11::CLI11)
ddp_strict(ddpstore)

add_executable(ddpstore-bench ddpstore_bench.cpp bench_floor_server.cpp bench_rendezvous.cpp)
target_link_libraries(ddpstore-bench PRIVATE ddp::store CLI11::CLI11)
ddp_strict(ddpstore-bench)
