//! Conversions between openraft's messages and `proto/raftmq/v1/raft.proto`.
//! Everything from the wire is validated here: a malformed field is an
//! error for the caller to report, never a panic.

use std::io;

use openraft::raft::{
    AppendEntriesRequest, StreamAppendError, StreamAppendResult, TransferLeaderRequest, VoteRequest, VoteResponse,
};

use crate::entry;
use crate::pb;
use crate::types::{LogId, TypeConfig, Vote, log_id, term_of};

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("missing or malformed {what}"))
}

pub fn vote_to_pb(v: &Vote) -> pb::Vote {
    pb::Vote {
        term: v.leader_id.term,
        voted_for: v.leader_id.voted_for,
        committed: v.committed,
    }
}

pub fn vote_from_pb(v: Option<pb::Vote>) -> io::Result<Vote> {
    let v = v.ok_or_else(|| invalid("vote"))?;
    Ok(if v.committed {
        Vote::new_committed(v.term, v.voted_for)
    } else {
        Vote::new(v.term, v.voted_for)
    })
}

pub fn log_id_to_pb(id: &LogId) -> pb::LogId {
    pb::LogId {
        term: term_of(id),
        index: id.index,
    }
}

pub fn log_id_from_pb(id: pb::LogId) -> LogId {
    log_id(id.term, id.index)
}

pub fn append_to_pb(req: &AppendEntriesRequest<TypeConfig>) -> pb::AppendRequest {
    pb::AppendRequest {
        vote: Some(vote_to_pb(&req.vote)),
        prev_log_id: req.prev_log_id.as_ref().map(log_id_to_pb),
        entries: req.entries.iter().map(entry::to_pb).collect(),
        leader_commit: req.leader_commit.as_ref().map(log_id_to_pb),
    }
}

pub fn append_from_pb(req: pb::AppendRequest) -> io::Result<AppendEntriesRequest<TypeConfig>> {
    Ok(AppendEntriesRequest {
        vote: vote_from_pb(req.vote)?,
        prev_log_id: req.prev_log_id.map(log_id_from_pb),
        entries: req.entries.into_iter().map(entry::from_pb).collect::<io::Result<_>>()?,
        leader_commit: req.leader_commit.map(log_id_from_pb),
    })
}

pub fn append_result_to_pb(r: StreamAppendResult<TypeConfig>) -> pb::AppendResponse {
    use pb::append_response::Result as R;
    pb::AppendResponse {
        result: Some(match r {
            Ok(matched) => R::Matched(pb::Matched {
                log_id: matched.as_ref().map(log_id_to_pb),
            }),
            Err(StreamAppendError::Conflict(id)) => R::Conflict(log_id_to_pb(&id)),
            Err(StreamAppendError::HigherVote(v)) => R::HigherVote(vote_to_pb(&v)),
        }),
    }
}

pub fn append_result_from_pb(r: pb::AppendResponse) -> io::Result<StreamAppendResult<TypeConfig>> {
    use pb::append_response::Result as R;
    Ok(match r.result.ok_or_else(|| invalid("append result"))? {
        R::Matched(m) => Ok(m.log_id.map(log_id_from_pb)),
        R::Conflict(id) => Err(StreamAppendError::Conflict(log_id_from_pb(id))),
        R::HigherVote(v) => Err(StreamAppendError::HigherVote(vote_from_pb(Some(v))?)),
    })
}

pub fn vote_req_to_pb(req: &VoteRequest<TypeConfig>) -> pb::VoteRequest {
    pb::VoteRequest {
        vote: Some(vote_to_pb(&req.vote)),
        last_log_id: req.last_log_id.as_ref().map(log_id_to_pb),
        leadership_transfer: req.leadership_transfer,
    }
}

pub fn vote_req_from_pb(req: pb::VoteRequest) -> io::Result<VoteRequest<TypeConfig>> {
    let mut r = VoteRequest::new(vote_from_pb(req.vote)?, req.last_log_id.map(log_id_from_pb));
    r.leadership_transfer = req.leadership_transfer;
    Ok(r)
}

pub fn vote_resp_to_pb(r: &VoteResponse<TypeConfig>) -> pb::VoteResponse {
    pb::VoteResponse {
        vote: Some(vote_to_pb(&r.vote)),
        vote_granted: r.vote_granted,
        last_log_id: r.last_log_id.as_ref().map(log_id_to_pb),
    }
}

pub fn vote_resp_from_pb(r: pb::VoteResponse) -> io::Result<VoteResponse<TypeConfig>> {
    Ok(VoteResponse::new(
        vote_from_pb(r.vote)?,
        r.last_log_id.map(log_id_from_pb),
        r.vote_granted,
    ))
}

pub fn transfer_to_pb(req: &TransferLeaderRequest<TypeConfig>) -> pb::TransferLeaderRequest {
    pb::TransferLeaderRequest {
        from_leader: Some(vote_to_pb(req.from_leader())),
        to_node_id: *req.to_node_id(),
        last_log_id: req.last_log_id().map(log_id_to_pb),
    }
}

pub fn transfer_from_pb(req: pb::TransferLeaderRequest) -> io::Result<TransferLeaderRequest<TypeConfig>> {
    Ok(TransferLeaderRequest::new(
        vote_from_pb(req.from_leader)?,
        req.to_node_id,
        req.last_log_id.map(log_id_from_pb),
    ))
}
