//! Compiles `proto/raftmq/v1/raft.proto` with protox (a protobuf compiler in
//! Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../proto/raftmq/v1/raft.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../proto"])?;
    tonic_prost_build::configure()
        .bytes(".raftmq.v1.Entry.payload")
        .bytes(".raftmq.v1.SnapshotChunk.data")
        .compile_fds(fds)?;
    Ok(())
}
