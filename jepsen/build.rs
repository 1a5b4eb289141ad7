//! Compiles the RocketMQ 5 client protocol from the repository's `proto/`
//! with protox (no system `protoc`): the harness speaks to raftmq only as a
//! client would.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "../proto/apache/rocketmq/v2/definition.proto",
        "../proto/apache/rocketmq/v2/service.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["../proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .bytes(".apache.rocketmq.v2.Message.body")
        .compile_fds(fds)?;
    Ok(())
}
