//! The broker's error type, and the one place where errors become gRPC
//! status codes.

use raftmq_raft::RaftError;
use tonic::{Code, Status};

use crate::proto::rocketmq::v2::Code as V2Code;

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("topic {0} does not exist")]
    TopicNotFound(String),
    #[error("{0}")]
    Invalid(String),
    /// No leader, or it could not be reached: retry.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The write may or may not have happened.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    #[error("disk full: {0}")]
    DiskFull(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// A client-protocol refusal with its own `apache.rocketmq.v2` code.
    #[error("{1}")]
    Refused(V2Code, String),
}

impl BrokerError {
    /// The `apache.rocketmq.v2` status code of this error.
    pub fn v2_code(&self) -> V2Code {
        match self {
            BrokerError::TopicNotFound(_) => V2Code::TopicNotFound,
            BrokerError::Invalid(_) => V2Code::BadRequest,
            // Retryable: the clients retry internal errors and timeouts.
            BrokerError::Unavailable(_) => V2Code::HaNotAvailable,
            BrokerError::OutcomeUnknown(_) => V2Code::ProxyTimeout,
            BrokerError::DiskFull(_) => V2Code::InternalServerError,
            BrokerError::Internal(_) => V2Code::InternalError,
            BrokerError::Refused(code, _) => *code,
        }
    }

    /// This error as an `apache.rocketmq.v2.Status`.
    pub fn v2_status(&self) -> crate::proto::rocketmq::v2::Status {
        crate::proto::rocketmq::v2::Status {
            code: self.v2_code() as i32,
            message: self.to_string(),
        }
    }
}

impl From<RaftError> for BrokerError {
    fn from(e: RaftError) -> Self {
        match e {
            RaftError::NotLeader { .. } | RaftError::Unavailable(_) => BrokerError::Unavailable(e.to_string()),
            RaftError::OutcomeUnknown(m) => BrokerError::OutcomeUnknown(m),
            RaftError::Invalid(m) => BrokerError::Invalid(m),
            RaftError::Store(raftmq_store::StoreError::BadArgument(m)) => BrokerError::Invalid(m),
            other => BrokerError::Internal(other.to_string()),
        }
    }
}

impl From<BrokerError> for Status {
    fn from(e: BrokerError) -> Status {
        let code = match &e {
            BrokerError::TopicNotFound(_) => Code::NotFound,
            BrokerError::Invalid(_) => Code::InvalidArgument,
            BrokerError::Unavailable(_) => Code::Unavailable,
            BrokerError::OutcomeUnknown(_) => Code::Aborted,
            BrokerError::DiskFull(_) => Code::ResourceExhausted,
            BrokerError::Internal(_) => Code::Internal,
            BrokerError::Refused(c, _) => match c {
                V2Code::NotFound
                | V2Code::TopicNotFound
                | V2Code::ConsumerGroupNotFound
                | V2Code::MessageNotFound
                | V2Code::OffsetNotFound => Code::NotFound,
                V2Code::Unsupported | V2Code::NotImplemented => Code::Unimplemented,
                V2Code::TooManyRequests => Code::ResourceExhausted,
                V2Code::Forbidden => Code::PermissionDenied,
                V2Code::Unauthorized => Code::Unauthenticated,
                _ => Code::InvalidArgument,
            },
        };
        Status::new(code, e.to_string())
    }
}

impl From<Status> for BrokerError {
    /// A forwarded call's failure, mapped back.
    fn from(s: Status) -> Self {
        let m = s.message().to_string();
        match s.code() {
            Code::NotFound => BrokerError::TopicNotFound(m),
            Code::InvalidArgument => BrokerError::Invalid(m),
            Code::Aborted => BrokerError::OutcomeUnknown(m),
            // A connection that died mid-call (the leader crashed): the
            // request may or may not have been applied.
            Code::Unknown => BrokerError::OutcomeUnknown(format!("the call to the leader failed: {m}")),
            Code::ResourceExhausted if m.starts_with("disk full") => BrokerError::DiskFull(m),
            Code::ResourceExhausted => BrokerError::Refused(V2Code::TooManyRequests, m),
            Code::PermissionDenied => BrokerError::Refused(V2Code::Forbidden, m),
            Code::Unavailable => BrokerError::Unavailable(m),
            // The client's time ran out while the leader worked on it.
            Code::DeadlineExceeded | Code::Cancelled => {
                BrokerError::OutcomeUnknown(format!("the leader did not answer in time: {m}"))
            }
            _ => BrokerError::Internal(m),
        }
    }
}
