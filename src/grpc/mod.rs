//! The transports onto the broker core: `apache.rocketmq.v2` for the
//! official clients ([`rocketmq`]), `raftmq.v1.Broker` for raftmq's own
//! tools ([`raftmq`]), and the HTTP/2 shim in front of the client port.

pub mod h2_authority;
pub mod raftmq;
pub mod rocketmq;
