//! Compiles raftmq's own broker service, `proto/raftmq/v1/broker.proto`,
//! with protox (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/raftmq/v1/broker.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".raftmq.v1.Message.body")
        .bytes(".raftmq.v1.PingRequest.payload")
        .bytes(".raftmq.v1.PingResponse.payload")
        .compile_fds(fds)?;
    Ok(())
}
