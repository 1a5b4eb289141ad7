//! The checker: nine checks over a history, in the manner of Jepsen's queue
//! and Kafka checkers, plus the replica logs and commit-index samples the
//! harness collected (see `observations`).
//!
//! Each check yields a [`CheckResult`] with anomalies of named kinds; the
//! run is valid iff every judged check passed. In the order they run:
//!
//! 1. `unique-offsets`: a queue offset names one message forever. No
//!    (key, offset) may hold two different values across ok send
//!    completions, ok polls and ok drains (`inconsistent-offset`).
//! 2. `no-lost-writes`: an acknowledged send survives every fault. Every ok
//!    send's value is at its (key, offset) in the drain of every node that
//!    drained that key (`lost-write`); an ok send without an offset must at
//!    least be somewhere in each node's drain. Every value read (poll or
//!    drain) was sent to that key (`phantom-read`: never sent; `wrong-key`:
//!    sent to another key), and not by a send that certainly failed
//!    (`failed-write-read`); timed and transactional sends count as sends
//!    here. After healing every replica serves the same
//!    queue: drains of one key from different nodes have the same length
//!    (`replica-divergence`; differing contents show as inconsistent offsets),
//!    and a key with acknowledged sends has an ok drain from every node that
//!    was drained at all (`undrained`: otherwise its writes go unverified).
//! 3. `duplicates`: a value of a plain send stored at two or more distinct
//!    (key, offset) positions, as read (held values: check 6), is a
//!    `duplicate`, whatever its sends' outcomes: the workload retries a send
//!    whose outcome was unknown with the same message id (as the official
//!    clients do), and the broker's deduplication window stores it once, as
//!    it does a follower's forwarding retried after a timeout. The check's
//!    line opens with `duplicates: N (unknown outcomes: M)`.
//! 4. `monotonic-consumers`: a consumer reads its queue in order. For each
//!    client process and key, between (re)assignments: an ok poll's messages
//!    start at its `from` and are consecutive, and its `from` is where the
//!    previous ok poll left off (the offset after its last message, which is
//!    `from + len` for a consecutive poll), or the assign's offset (0 when
//!    nothing was committed) for the first poll: `skip` (forward),
//!    `backwards`, `nonconsecutive` (a repeat or reorder inside one poll).
//!    Polls before any assign of their process set the baseline; failed or
//!    unknown polls are ignored; a failed or unknown assign forgets the
//!    position. Committed offsets never go backwards (`commit-regressed`):
//!    a (group, key)'s ok commits, in completion order, never decrease, and
//!    an ok assign invoked after an ok commit completed starts at or after
//!    the largest such commit (an absent offset counts as 0), unless it
//!    starts at the offset of a commit still in doubt (not yet answered,
//!    or answered with an unknown outcome, which may take effect late).
//! 5. `replicas`: the Raft logs agree. Each replica's record indexes
//!    increase by one (`log-gap`). Up to the smallest committed index over
//!    the replicas (a replica that did not persist one counts its last
//!    index), any index that two replicas both hold has the same term and
//!    CRC in each (`log-divergence`). Each node's sampled commit index never
//!    decreases over time, across restarts too (`commit-index-regressed`),
//!    except into an incarnation that began with a simulated power loss or
//!    the corrupt nemesis's damage: the broker keeps its committed index
//!    without fsync, as Raft allows, and damage may cost a node its log
//!    (`commit-index-regressed-after-power-loss`, reported, not judged).
//!    Every node that was sampled must have had its log read back after
//!    the run (`replica-unread`), or nothing above was compared for it.
//! 6. `held-messages`: timed and transactional messages. A held value is
//!    never at two positions, whatever its send's outcome (`timed-duplicate`,
//!    `txn-duplicate`: the broker releases each held message once, under a
//!    guard, and holds a retried send, deduplicated, once). An ok timed send is, once due (by
//!    the history's clock, before the drain began), in the drain of every
//!    node that drained its key (`timed-lost`); one read before it was due
//!    is `timed-visible-early`, reported, not judged (a skewed leader clock
//!    releases early). A transaction ends once: by its producer's ok
//!    `txn-end`, or by an ok `txn-check` answer, or else by a check-back
//!    answered by
//!    [`check_back_answer`](crate::history::check_back_answer). What each
//!    may have ended as:
//!    - an ok `txn-end` or `txn-check` is certain: its resolution, and
//!      nothing else; two ok ones are a `txn-resolved-twice` (the broker
//!      refuses to end a transaction that is no longer pending);
//!    - otherwise the check-back's answer; and also the resolution of any
//!      end or answer whose outcome is unknown; and also "not visible" when
//!      the send's outcome is unknown (never stored) or when the history has
//!      no ok `settle` (it may still be pending at the drain). A `txn-end`
//!      that failed changed nothing (refused, or the check-back came first).
//!
//!    A transaction that may only have committed is in the drain of every
//!    node that drained its key (`committed-lost`); one that cannot have
//!    committed is never read, by a poll or a drain (`rolled-back-visible`).
//!    Transactions whose sends all failed are left to `failed-write-read`.
//!    A held key with an ok held send must have an ok drain from every node
//!    drained at all (`held-undrained`).
//! 7. `membership`: after healing, every node names the intended group:
//!    all the harness's nodes as voters, no learners (`membership-wrong`,
//!    `membership-unread`; not judged for runs that did not read members).
//! 8. `availability`: reported, not judged (always passed). Counts, rates,
//!    latencies and the longest stretches without an ok send, overall and
//!    around each fault, in [`Stats`].
//! 9. `access`: no call was refused for want of credentials or a policy
//!    (`unauthorized`). With `--secure` the workload's user and policy are
//!    the group's replicated state and must hold on every node through
//!    every fault; without it, nothing is refused so.
//!
//! Anomalies are capped at [`MAX_ANOMALIES_PER_KIND`] per kind in
//! `anomalies`; `counts` always counts every one found. An anomaly's `ops`
//! are the `index` fields of the history operations involved (invocations
//! and completions as relevant).
//!
//! Malformed histories never panic: a completion without an invocation (or
//! whose invocation is of another `f`) still counts for what it says, an
//! invocation without a completion is treated as an unknown outcome.
//!
//! Module map: one file per check, named for it, and here what they share.
//!
//! - [`unique_offsets`](mod@unique_offsets): 1, `unique-offsets`.
//! - [`lost_writes`](mod@lost_writes): 2, `no-lost-writes`.
//! - [`duplicates`](mod@duplicates): 3, `duplicates`.
//! - [`monotonic`](mod@monotonic): 4, `monotonic-consumers`.
//! - [`replicas`](mod@replicas): 5, `replicas`.
//! - [`held`](mod@held): 6, `held-messages`.
//! - [`membership`](mod@membership): 7, `membership`.
//! - [`availability`](mod@availability): 8, `availability`, with its
//!   latency percentiles and gap windows.
//! - [`access`](mod@access): 9, `access`.
//! - [`report`](mod@report): the inputs and results, [`summary`].
//! - `facts`: what the checks share: the limits, the history indexed once
//!   (`Facts`), every node's drains (`Drains`, for checks 2 and 6) and
//!   collecting anomalies (`Sink`).
//! - this module: [`check`], which runs them all.
//! - `test_support` (tests only): the history builders and assertions the
//!   checks' tests share.

mod access;
mod availability;
mod duplicates;
mod facts;
mod held;
mod lost_writes;
mod membership;
mod monotonic;
mod replicas;
pub mod report;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
mod unique_offsets;

use access::access;
use availability::availability;
use duplicates::duplicates;
use facts::{Drains, Facts};
use held::held_messages;
use lost_writes::no_lost_writes;
use membership::membership;
use monotonic::monotonic_consumers;
use replicas::replicas;
pub use report::{Inputs, Results, summary};
use unique_offsets::unique_offsets;

/// Runs every check.
pub fn check(inputs: &Inputs) -> Results {
    let facts = Facts::new(inputs.ops);
    let drains = Drains::new(&facts);
    let (availability, mut stats) = availability(&facts);
    let (held, held_stats) = held_messages(&facts, &drains);
    stats.held = held_stats;
    let checks = vec![
        unique_offsets(&facts),
        no_lost_writes(&facts, &drains),
        duplicates(&facts),
        monotonic_consumers(&facts),
        replicas(inputs.replicas, inputs.commits),
        held,
        membership(inputs.members),
        availability,
        access(inputs.ops),
    ];
    let valid = checks.iter().all(|c| !c.judged || c.passed);
    Results { valid, checks, stats }
}
