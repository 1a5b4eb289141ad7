//! The wire: code generated from `proto/` at build time, and the
//! conversions between it and the core's types.

pub mod v1;
pub mod v2_message;

pub mod pb {
    //! Generated from `proto/raftmq/v1/{broker,namesrv}.proto`.
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("raftmq.v1");
}

pub mod rocketmq {
    //! The Apache RocketMQ 5 client protocol, `apache.rocketmq.v2`, generated
    //! from `proto/apache/rocketmq/v2/` (written for this project to match the
    //! public rocketmq-apis v2.1.2 on the wire; checked field by field against
    //! its descriptors). Served by [`crate::grpc::rocketmq`].
    pub mod v2 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("apache.rocketmq.v2");
    }
}
