//! The label sets of the counted metric families (RocketMQ 5's label names).

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabels {
    pub topic: String,
    pub message_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumeLabels {
    pub topic: String,
    pub consumer_group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub protocol_type: &'static str,
    /// The RPC, as the protocol names it (`SendMessage`).
    pub request_code: &'static str,
    /// The answer's code (`OK`, `MESSAGE_NOT_FOUND`...).
    pub response_code: &'static str,
}
