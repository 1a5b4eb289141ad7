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

/// Largest term or log index a peer may send. openraft adds to both (a
/// candidate's term + 1, an entry's index + 1), so a value near u64::MAX
/// from the network would overflow inside it; real ones never come close.
pub const MAX_TERM: u64 = u64::MAX >> 2;
pub const MAX_INDEX: u64 = u64::MAX >> 2;

fn check_log_id(id: Option<&LogId>, what: &str) -> io::Result<()> {
    match id {
        Some(id) if term_of(id) > MAX_TERM || id.index > MAX_INDEX => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} {}-{} is out of range", term_of(id), id.index),
        )),
        _ => Ok(()),
    }
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
    if v.term > MAX_TERM {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("vote term {} is out of range", v.term),
        ));
    }
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

/// An append request from a peer, refused unless storage could take it:
/// entries whose records fit in `max_record_size`, in-range ids, and
/// entries that follow `prev_log_id` one index at a time with terms that
/// never decrease nor pass the sender's vote (openraft treats a storage
/// error as fatal, so a peer must not be able to cause one).
pub fn append_from_pb(req: pb::AppendRequest, max_record_size: u64) -> io::Result<AppendEntriesRequest<TypeConfig>> {
    if let Some(e) = req
        .entries
        .iter()
        .find(|e| raftmq_store::record::encoded_len(e.payload.len()) as u64 > max_record_size)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "entry {} of {} bytes does not fit this node's max_record_size {max_record_size}",
                e.index,
                e.payload.len()
            ),
        ));
    }
    let r: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: vote_from_pb(req.vote)?,
        prev_log_id: req.prev_log_id.map(log_id_from_pb),
        entries: req
            .entries
            .into_iter()
            .map(entry::from_pb)
            .collect::<io::Result<Vec<crate::types::Entry>>>()?,
        leader_commit: req.leader_commit.map(log_id_from_pb),
    };
    check_log_id(r.prev_log_id.as_ref(), "prev_log_id")?;
    check_log_id(r.leader_commit.as_ref(), "leader_commit")?;
    let mut prev = r.prev_log_id;
    for e in &r.entries {
        check_log_id(Some(&e.log_id), "entry")?;
        let expected = prev.map_or(e.log_id.index, |p| p.index + 1);
        let term_ok =
            prev.is_none_or(|p| term_of(&p) <= term_of(&e.log_id)) && term_of(&e.log_id) <= r.vote.leader_id.term;
        if e.log_id.index != expected || !term_ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "entries do not follow each other: {}-{} after {:?}",
                    term_of(&e.log_id),
                    e.log_id.index,
                    prev.map(|p| (term_of(&p), p.index))
                ),
            ));
        }
        prev = Some(e.log_id);
    }
    Ok(r)
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
    let last = req.last_log_id.map(log_id_from_pb);
    check_log_id(last.as_ref(), "last_log_id")?;
    let mut r = VoteRequest::new(vote_from_pb(req.vote)?, last);
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
    let last = req.last_log_id.map(log_id_from_pb);
    check_log_id(last.as_ref(), "last_log_id")?;
    Ok(TransferLeaderRequest::new(
        vote_from_pb(req.from_leader)?,
        req.to_node_id,
        last,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank(term: u64, index: u64) -> pb::Entry {
        entry::to_pb(&entry::from_parts(term, index, entry::KIND_BLANK, bytes::Bytes::new()).unwrap())
    }

    fn append(vote_term: u64, prev: Option<(u64, u64)>, entries: Vec<pb::Entry>) -> pb::AppendRequest {
        pb::AppendRequest {
            vote: Some(pb::Vote {
                term: vote_term,
                voted_for: 1,
                committed: true,
            }),
            prev_log_id: prev.map(|(term, index)| pb::LogId { term, index }),
            entries,
            leader_commit: None,
        }
    }

    /// [`append_from_pb`] with room for any entry.
    fn append_from_pb_any(req: pb::AppendRequest) -> io::Result<AppendEntriesRequest<TypeConfig>> {
        append_from_pb(req, u64::MAX)
    }

    #[test]
    fn appends_that_storage_could_not_take_are_refused_at_the_edge() {
        // Consecutive, terms rising up to the vote's: fine.
        assert!(append_from_pb_any(append(3, Some((1, 4)), vec![blank(1, 5), blank(3, 6)])).is_ok());
        assert!(append_from_pb_any(append(3, None, vec![blank(1, 0), blank(1, 1)])).is_ok());
        // A gap, a repeat, a term going back or past the vote's: refused.
        assert!(append_from_pb_any(append(3, Some((1, 4)), vec![blank(1, 6)])).is_err());
        assert!(append_from_pb_any(append(3, Some((1, 4)), vec![blank(1, 5), blank(1, 5)])).is_err());
        assert!(append_from_pb_any(append(3, Some((2, 4)), vec![blank(1, 5)])).is_err());
        assert!(append_from_pb_any(append(3, Some((1, 4)), vec![blank(4, 5)])).is_err());
        // Terms and indexes near u64::MAX, which openraft would add to.
        assert!(append_from_pb_any(append(u64::MAX, None, vec![])).is_err());
        assert!(append_from_pb_any(append(3, Some((1, u64::MAX)), vec![])).is_err());
        // An entry whose record would not fit is refused before the store.
        let big = |len: usize| {
            let mut e = blank(1, 5);
            e.payload = vec![0; len].into();
            append(3, Some((1, 4)), vec![e])
        };
        let fits = raftmq_store::record::encoded_len(100) as u64;
        assert!(append_from_pb(big(100), fits).is_ok());
        assert!(append_from_pb(big(101), fits).is_err());
        let vote = pb::VoteRequest {
            vote: Some(pb::Vote {
                term: u64::MAX,
                voted_for: 2,
                committed: false,
            }),
            last_log_id: None,
            leadership_transfer: false,
        };
        assert!(vote_req_from_pb(vote).is_err());
    }
}
