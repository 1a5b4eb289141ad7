//! Compiles raftmq's own services (`proto/raftmq/v1/broker.proto`,
//! `namesrv.proto`) with protox (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/raftmq/v1/broker.proto", "proto/raftmq/v1/namesrv.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".raftmq.v1.Message.body")
        .bytes(".raftmq.v1.PingRequest.payload")
        .bytes(".raftmq.v1.PingResponse.payload")
        .compile_fds(fds)?;
    Ok(())
}
