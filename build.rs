//! Compiles raftmq's own services (`proto/raftmq/v1/broker.proto`,
//! `namesrv.proto`) and the RocketMQ 5 client protocol
//! (`proto/apache/rocketmq/v2/`) with protox (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/raftmq/v1/broker.proto",
        "proto/raftmq/v1/namesrv.proto",
        "proto/apache/rocketmq/v2/definition.proto",
        "proto/apache/rocketmq/v2/service.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".raftmq.v1.Message.body")
        .bytes(".raftmq.v1.PingRequest.payload")
        .bytes(".raftmq.v1.PingResponse.payload")
        .bytes(".apache.rocketmq.v2.Message.body")
        .compile_fds(fds)?;
    Ok(())
}
