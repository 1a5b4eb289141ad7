//! Where the messages of one stored batch went: the leader's answer to a
//! send, from which every transport builds its per-message receipts.

use raftmq_raft::command::{self, Duplicate};

/// A batch sent to `queue_id`: the messages stored anew got offsets from
/// `first_queue_offset` on, in order; `duplicates` (in batch order) were
/// stored by an earlier send with the same message id and are where that
/// send put them ([`raftmq_raft::dedup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub queue_id: u32,
    pub first_queue_offset: u64,
    /// Messages stored anew.
    pub count: u32,
    pub duplicates: Vec<Duplicate>,
}

impl Stored {
    /// The `k`th message's (queue id, queue offset).
    pub fn position(&self, k: usize) -> (u32, u64) {
        let k = u32::try_from(k).unwrap_or(u32::MAX);
        command::position(self.first_queue_offset, self.queue_id, &self.duplicates, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_keep_their_first_position_and_the_rest_close_up() {
        let s = Stored {
            queue_id: 2,
            first_queue_offset: 10,
            count: 2,
            duplicates: vec![
                Duplicate {
                    index: 0,
                    queue_id: 1,
                    queue_offset: 4,
                },
                Duplicate {
                    index: 2,
                    queue_id: 2,
                    queue_offset: 7,
                },
            ],
        };
        let got: Vec<_> = (0..4).map(|k| s.position(k)).collect();
        assert_eq!(got, vec![(1, 4), (2, 10), (2, 7), (2, 11)]);
    }
}
