//! The deduplication window: the message ids a broker group stored
//! recently, per topic, so that a producer's retry of a send whose reply it
//! never saw (a timeout, a leader killed between storing and answering) is
//! not stored a second time.
//!
//! The official RocketMQ 5 clients keep a message's `message_id` across
//! every retry of its send. The window remembers, for each (topic, message
//! id) a producer send stored, where the message went; applying a send
//! whose id is already there stores nothing for that message and answers
//! with the first copy's queue and offset. The window is replicated state:
//! every replica applies the same entries to the same window (it is carried
//! in snapshots and rebuilt by replaying the log after a restart), so a new
//! leader after failover knows every id the old one stored.
//!
//! What falls out of the window is forgotten: ids older than
//! [`DedupConfig::window_ms`] by the window's clock, and the oldest ids
//! past [`DedupConfig::max_ids`]. A retry after that is stored again
//! (at-least-once), as is every send of a client that changes the id on
//! retry.
//!
//! # The window's clock
//!
//! Time in the window is replicated too: it moves with the store
//! timestamps the leaders stamped into the entries, never with a replica's
//! own clock, and by at most [`MAX_CLOCK_STEP_MS`] from one entry to the
//! next, never back. A leader whose clock runs ten minutes ahead therefore
//! ages the window by 10 s, not by ten minutes (which would forget every id
//! the old leader stored, just when failover makes retries likely); a clock
//! set back stops the window until the stamps pass the latest one again.
//! An idle pause counts as at most one step too, so ids are kept at least
//! `window_ms` of store time, longer across pauses, never past `max_ids`.
//! Re-applying an entry (after a failed try) moves the clock no further.
//!
//! # Layout in memory
//!
//! A (topic, message id) is kept as its 128-bit SipHash-1-3 fingerprint
//! under a fixed key, so every replica computes the same one and no id
//! costs a heap allocation. Two different ids share a fingerprint with
//! probability 2^-128 per pair (about 10^-27 for a full window against all
//! the ids of a busy group's lifetime), and making one on purpose takes
//! ~2^128 tries: a fingerprint is taken for the id. Slots sit in apply
//! order in a ring; a hash map points from a fingerprint's low 64 bits to
//! its slot, which holds all 128. Two live ids whose low halves meet
//! (about once in 3*10^7 full windows) share one map entry: the older is
//! then not found, and its retry is stored again (at-least-once); every
//! replica computes the same fingerprints and so meets the same case.
//! Evicting is popping the ring's front. Measured in `benches/README.md`
//! (`cargo run --release -p raftmq-raft --example dedup_window`).

use std::collections::VecDeque;
use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};
use siphasher::sip128::SipHasher13;

/// How long and how many ids the window keeps; replicated (in the
/// metadata), so that every replica evicts the same ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupConfig {
    /// Ids stored longer ago than this (by store timestamps) are forgotten;
    /// 0 turns deduplication off.
    pub window_ms: u64,
    /// The window never holds more ids than this; the oldest go first.
    pub max_ids: u64,
}

/// NATS JetStream's default duplicate window, long enough for every
/// official client's retries (3 attempts of at most a few seconds each).
pub const DEFAULT_WINDOW_MS: u64 = 120_000;
/// About 80 MiB of memory on each node when full (84 bytes an id), and
/// about 73 MiB in a snapshot.
pub const DEFAULT_MAX_IDS: u64 = 1_000_000;
/// The most ids a window may be configured to keep: a snapshot holding
/// them stays below [`crate::state_machine::MAX_SNAPSHOT_BYTES`].
pub const MAX_IDS_LIMIT: u64 = 2_000_000;

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            window_ms: DEFAULT_WINDOW_MS,
            max_ids: DEFAULT_MAX_IDS,
        }
    }
}

impl DedupConfig {
    pub fn enabled(&self) -> bool {
        self.window_ms > 0 && self.max_ids > 0
    }

    /// Why this configuration cannot be applied, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        (self.max_ids > MAX_IDS_LIMIT).then(|| {
            format!(
                "a deduplication window keeps at most {MAX_IDS_LIMIT} ids, not {}",
                self.max_ids
            )
        })
    }
}

/// A queue offset not known when the id was put in the window (the entry
/// was applied again after a restart, below the dispatch checkpoint, and
/// its queue no longer held the message): a retry of it is answered with it.
pub const UNKNOWN_OFFSET: u64 = u64::MAX;

/// Where the first copy of a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Original {
    pub queue_id: u32,
    pub queue_offset: u64,
    /// Its physical offset in the CommitLog: the same message applied a
    /// second time (after a failed try) has the same one, a retry not.
    pub phys: u64,
}

/// The most the window's clock moves from one entry to the next: a
/// leader's clock that jumps ahead can make the window forget at most this
/// much early. The official clients' retries of a send span a few seconds.
pub const MAX_CLOCK_STEP_MS: u64 = 10_000;

/// The window's clock (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Clock {
    now_ms: u64,
    /// The latest store timestamp seen; None before the first.
    latest_stamp_ms: Option<u64>,
}

impl Clock {
    /// Moves the clock for an entry stamped `stamp_ms`; the new time.
    fn tick(&mut self, stamp_ms: u64) -> u64 {
        let latest = match self.latest_stamp_ms {
            None => {
                self.now_ms = stamp_ms;
                stamp_ms
            }
            Some(latest) => {
                self.now_ms += stamp_ms.saturating_sub(latest).min(MAX_CLOCK_STEP_MS);
                latest.max(stamp_ms)
            }
        };
        self.latest_stamp_ms = Some(latest);
        self.now_ms
    }
}

/// 48 bytes, no heap: the fields are ordered so that nothing pads.
#[derive(Debug, Clone)]
struct Slot {
    key: Key,
    queue_offset: u64,
    phys: u64,
    /// The window's clock when it went in.
    stored_ms: u64,
    queue_id: u32,
    /// [`topic_hash`] of its topic.
    topic: u32,
}

impl Slot {
    fn original(&self) -> Original {
        Original {
            queue_id: self.queue_id,
            queue_offset: self.queue_offset,
            phys: self.phys,
        }
    }
}

/// The fingerprint of a (topic, message id), built once per message for
/// both the lookup and the insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(u128);

/// The fixed SipHash key: fingerprints are part of the replicated state
/// (snapshots carry them), so they must not change between nodes or
/// versions.
const FINGERPRINT_KEY: (u64, u64) = (0x7261_6674_6d71_2d64, 0x6564_7570_2d69_6473);

impl Key {
    fn low(&self) -> u64 {
        self.0 as u64
    }

    pub fn new(topic: &str, message_id: &str) -> Key {
        let mut h = SipHasher13::new_with_keys(FINGERPRINT_KEY.0, FINGERPRINT_KEY.1);
        // Length-prefixed: ("ab", "c") is not ("a", "bc").
        h.write(&(topic.len() as u64).to_le_bytes());
        h.write(topic.as_bytes());
        h.write(message_id.as_bytes());
        Key(siphasher::sip128::Hasher128::finish128(&h).as_u128())
    }
}

/// Fingerprints are uniform already: the map takes their low bits as they
/// are instead of hashing them again.
#[derive(Default)]
pub struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the map's keys); anything else still
        // hashes, if less well.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// The window; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct DedupWindow {
    slots: VecDeque<Slot>,
    /// Sequence number of `slots[0]`.
    first: u64,
    /// Fingerprint's low 64 bits -> sequence number of its slot.
    index: HashMap<u64, u64, BuildHasherDefault<FingerprintHasher>>,
    clock: Clock,
}

impl DedupWindow {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn position(&self, key: &Key) -> Option<usize> {
        let seq = *self.index.get(&key.low())?;
        usize::try_from(seq.checked_sub(self.first)?).ok()
    }

    /// Where `topic`'s message `message_id` was stored, if the window holds it.
    pub fn find(&self, topic: &str, message_id: &str) -> Option<Original> {
        self.find_key(&Key::new(topic, message_id))
    }

    /// Where the message of `key` was stored, if the window holds it.
    pub fn find_key(&self, key: &Key) -> Option<Original> {
        let slot = self.slots.get(self.position(key)?)?;
        (slot.key == *key).then(|| slot.original())
    }

    /// Moves the window's clock for an entry stamped `stamp_ms`, forgets
    /// what `cfg` no longer keeps, and makes room for one more id.
    pub fn evict(&mut self, cfg: &DedupConfig, stamp_ms: u64) {
        let now_ms = self.clock.tick(stamp_ms);
        while let Some(front) = self.slots.front() {
            let expired = front.stored_ms.saturating_add(cfg.window_ms) < now_ms;
            if !expired && (self.slots.len() as u64) < cfg.max_ids {
                break;
            }
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        let Some(s) = self.slots.pop_front() else {
            return;
        };
        let seq = self.first;
        self.first += 1;
        if let Entry::Occupied(e) = self.index.entry(s.key.low())
            && *e.get() == seq
        {
            e.remove();
        }
    }

    /// Puts an id in the window at the clock's time (after [`Self::evict`]
    /// moved it and [`Self::find`] found the id absent).
    pub fn insert(&mut self, topic: &str, message_id: &str, original: Original) {
        self.insert_key(Key::new(topic, message_id), topic_hash(topic), original);
    }

    /// [`Self::insert`] of a key already built; `topic` is [`topic_hash`]
    /// of its topic.
    pub fn insert_key(&mut self, key: Key, topic: u32, original: Original) {
        self.push(Slot {
            key,
            queue_offset: original.queue_offset,
            phys: original.phys,
            stored_ms: self.clock.now_ms,
            queue_id: original.queue_id,
            topic,
        });
    }

    fn push(&mut self, slot: Slot) {
        let seq = self.first + self.slots.len() as u64;
        self.index.insert(slot.key.low(), seq);
        self.slots.push_back(slot);
    }

    /// Forgets a deleted topic's ids (a topic created again under the same
    /// name starts with an empty window). Fingerprints do not name their
    /// topic, so each slot keeps its [`topic_hash`] beside.
    pub fn remove_topic(&mut self, topic: &str) {
        let hash = topic_hash(topic);
        if !self.slots.iter().any(|s| s.topic == hash) {
            return;
        }
        let kept: Vec<Slot> = std::mem::take(&mut self.slots)
            .into_iter()
            .filter(|s| s.topic != hash)
            .collect();
        self.first = 0;
        self.index.clear();
        for s in kept {
            self.push(s);
        }
    }
}

/// Which topic a slot is of, for [`DedupWindow::remove_topic`]: a 32-bit
/// hash (a collision forgets another topic's ids too, which only makes
/// their retries at-least-once).
pub fn topic_hash(topic: &str) -> u32 {
    crc32fast::hash(topic.as_bytes())
}

/// A slot as snapshots hold it: `[fingerprint (low, high 64 bits), topic
/// hash, queue id, queue offset, physical offset, window time]`.
type SlotRepr = (u64, u64, u32, u32, u64, u64, u64);

fn repr(slot: &Slot) -> SlotRepr {
    (
        slot.key.0 as u64,
        (slot.key.0 >> 64) as u64,
        slot.topic,
        slot.queue_id,
        slot.queue_offset,
        slot.phys,
        slot.stored_ms,
    )
}

/// The slots, written one by one (a full window is 10^6 of them).
struct SlotsOut<'a>(&'a VecDeque<Slot>);

impl Serialize for SlotsOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(repr))
    }
}

/// The window as snapshots hold it: `{"clock": [now, latest stamp or
/// null], "slots": [SlotRepr, ...]}`, slots oldest first. The first build
/// with a window wrote the slots alone (no clock; stamps for times), which
/// still reads: its clock then starts at the newest slot's time.
impl Serialize for DedupWindow {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("DedupWindow", 2)?;
        st.serialize_field("clock", &(self.clock.now_ms, self.clock.latest_stamp_ms))?;
        st.serialize_field("slots", &SlotsOut(&self.slots))?;
        st.end()
    }
}

/// The slots, read one by one into a window, their count bounded.
struct SlotsIn<'a>(&'a mut DedupWindow);

impl<'de> serde::de::DeserializeSeed<'de> for SlotsIn<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for SlotsIn<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of deduplication window slots")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let w = self.0;
        let hint = seq.size_hint().unwrap_or(0).min(MAX_IDS_LIMIT as usize);
        w.slots.reserve(hint);
        while let Some((lo, hi, topic, queue_id, queue_offset, phys, stored_ms)) = seq.next_element::<SlotRepr>()? {
            if w.slots.len() as u64 >= MAX_IDS_LIMIT {
                return Err(serde::de::Error::custom(format!(
                    "a deduplication window of more than {MAX_IDS_LIMIT} ids"
                )));
            }
            w.push(Slot {
                key: Key(u128::from(lo) | (u128::from(hi) << 64)),
                queue_offset,
                phys,
                stored_ms,
                queue_id,
                topic,
            });
        }
        Ok(())
    }
}

/// Reads either layout (see [`DedupWindow`]'s `Serialize`).
struct WindowIn;

impl<'de> serde::de::Visitor<'de> for WindowIn {
    type Value = DedupWindow;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a deduplication window")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<DedupWindow, A::Error> {
        let mut w = DedupWindow::default();
        serde::de::Visitor::visit_seq(SlotsIn(&mut w), seq)?;
        let newest = w.slots.back().map(|s| s.stored_ms);
        w.clock = Clock {
            now_ms: newest.unwrap_or(0),
            latest_stamp_ms: newest,
        };
        Ok(w)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<DedupWindow, A::Error> {
        let mut w = DedupWindow::default();
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "clock" => {
                    let (now_ms, latest_stamp_ms) = map.next_value::<(u64, Option<u64>)>()?;
                    w.clock = Clock {
                        now_ms,
                        latest_stamp_ms,
                    };
                }
                "slots" => map.next_value_seed(SlotsIn(&mut w))?,
                other => return Err(serde::de::Error::unknown_field(other, &["clock", "slots"])),
            }
        }
        Ok(w)
    }
}

impl<'de> Deserialize<'de> for DedupWindow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WindowIn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Key::new("T", "id")`, as the first build that wrote snapshots made it.
    const FIXED_FINGERPRINT: u128 = 0x8c87_34d0_9df7_9750_9618_db48_fb7e_6a69;

    fn at(queue_offset: u64, phys: u64) -> Original {
        Original {
            queue_id: 1,
            queue_offset,
            phys,
        }
    }

    const KEEP_ALL: DedupConfig = DedupConfig {
        window_ms: u64::MAX,
        max_ids: 1000,
    };

    /// The window after an entry stamped `ms` put (topic, id) in it.
    fn put(w: &mut DedupWindow, cfg: &DedupConfig, topic: &str, id: &str, o: Original, ms: u64) {
        w.evict(cfg, ms);
        w.insert(topic, id, o);
    }

    #[test]
    fn finds_what_it_holds_per_topic() {
        let mut w = DedupWindow::default();
        put(&mut w, &KEEP_ALL, "a", "id1", at(0, 100), 10);
        put(&mut w, &KEEP_ALL, "b", "id1", at(5, 200), 10);
        assert_eq!(w.find("a", "id1"), Some(at(0, 100)));
        assert_eq!(w.find("b", "id1"), Some(at(5, 200)));
        assert_eq!(w.find("a", "id2"), None);
        // The length prefix keeps ("ab", "c") apart from ("a", "bc").
        put(&mut w, &KEEP_ALL, "ab", "c", at(9, 300), 10);
        assert_eq!(w.find("a", "bc"), None);
    }

    #[test]
    fn forgets_by_time_and_by_count() {
        let cfg = DedupConfig {
            window_ms: 1000,
            max_ids: 3,
        };
        let mut w = DedupWindow::default();
        for (i, ms) in [(0u64, 0u64), (1, 500), (2, 900)] {
            put(&mut w, &cfg, "t", &format!("m{i}"), at(i, i), ms);
        }
        // Full: the next id pushes out the oldest.
        w.evict(&cfg, 950);
        assert_eq!(w.len(), 2);
        assert_eq!(w.find("t", "m0"), None);
        w.insert("t", "m3", at(3, 3));
        // 1000 ms after 500 is still in; 1 ms later it is not.
        let cfg = DedupConfig { max_ids: 10, ..cfg };
        w.evict(&cfg, 1500);
        assert!(w.find("t", "m1").is_some());
        w.evict(&cfg, 1501);
        assert_eq!(w.find("t", "m1"), None);
        assert!(w.find("t", "m2").is_some());
        // A clock that went back (a new leader's) evicts nothing by time.
        w.evict(&cfg, 0);
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn a_clock_that_jumps_ahead_ages_the_window_by_one_step() {
        let cfg = DedupConfig {
            window_ms: 120_000,
            max_ids: 1000,
        };
        let mut w = DedupWindow::default();
        let t0 = 1_700_000_000_000;
        put(&mut w, &cfg, "t", "old", at(0, 0), t0);
        put(&mut w, &cfg, "t", "m", at(1, 1), t0 + 10_000);
        // A new leader ten minutes ahead: one step of 10 s, not ten minutes.
        w.evict(&cfg, t0 + 10_000 + 600_000);
        assert_eq!(w.find("t", "m"), Some(at(1, 1)));
        assert_eq!(w.find("t", "old"), Some(at(0, 0)));
        // Its clock set right again: the window waits for the stamps to
        // pass the latest one, then moves on from there.
        w.evict(&cfg, t0 + 11_000);
        w.evict(&cfg, t0 + 10_000 + 600_000 + 5_000);
        assert_eq!(w.clock.now_ms, t0 + 10_000 + MAX_CLOCK_STEP_MS + 5_000);
        assert!(w.find("t", "old").is_some());
        // Time goes on in steps: 120 s after "old" went in it is forgotten.
        let mut stamp = t0 + 615_000;
        while w.clock.now_ms <= t0 + 120_000 {
            stamp += 1000;
            w.evict(&cfg, stamp);
        }
        assert_eq!(w.clock.now_ms, t0 + 121_000);
        assert_eq!(w.find("t", "old"), None);
        assert!(w.find("t", "m").is_some());
        // An entry applied again (stamped before the latest) moves nothing.
        let now = w.clock.now_ms;
        w.evict(&cfg, t0);
        assert_eq!(w.clock.now_ms, now);
    }

    #[test]
    fn an_id_evicted_and_stored_again_is_found_at_its_new_place() {
        let cfg = DedupConfig {
            window_ms: 10,
            max_ids: 1000,
        };
        let mut w = DedupWindow::default();
        put(&mut w, &cfg, "t", "m", at(0, 0), 0);
        put(&mut w, &cfg, "t", "n", at(1, 1), 5);
        w.evict(&cfg, 11);
        assert_eq!(w.find("t", "m"), None);
        w.insert("t", "m", at(2, 2));
        put(&mut w, &cfg, "t", "o", at(3, 3), 12);
        assert_eq!(w.find("t", "m"), Some(at(2, 2)));
        // Evicting the slots in front leaves the index pointing right.
        w.evict(&cfg, 16);
        assert_eq!(w.find("t", "n"), None);
        assert_eq!(w.find("t", "m"), Some(at(2, 2)));
        // In steps of at most MAX_CLOCK_STEP_MS.
        w.evict(&cfg, 10_000);
        w.evict(&cfg, 20_000);
        assert!(w.is_empty() && w.index.is_empty());
    }

    #[test]
    fn fingerprints_never_change_and_slots_stay_small() {
        // Snapshots carry fingerprints: a change to how they are made
        // would make every replica forget the ids it was sent.
        let k = Key::new("T", "id").0;
        assert_eq!(k, FIXED_FINGERPRINT, "{k:#x}");
        assert_eq!(std::mem::size_of::<Slot>(), 48);
    }

    #[test]
    fn snapshots_round_trip_and_topics_go() {
        let mut w = DedupWindow::default();
        put(&mut w, &KEEP_ALL, "a", "x", at(0, 1), 5);
        put(&mut w, &KEEP_ALL, "b", "y", at(4, 2), 6);
        put(&mut w, &KEEP_ALL, "a", "z", at(1, 3), 7);
        let json = serde_json::to_string(&w).unwrap();
        let back: DedupWindow = serde_json::from_str(&json).unwrap();
        assert_eq!(back.find("b", "y"), Some(at(4, 2)));
        assert_eq!(back.find("a", "z"), Some(at(1, 3)));
        assert_eq!(back.len(), 3);
        assert_eq!(back.clock, w.clock);
        let mut back = back;
        back.remove_topic("a");
        assert_eq!(back.len(), 1);
        assert_eq!(back.find("a", "x"), None);
        assert!(back.find("b", "y").is_some());
        // Order is kept: the oldest is still evicted first.
        let cfg = DedupConfig {
            window_ms: 1,
            max_ids: 10,
        };
        put(&mut back, &cfg, "c", "w", at(0, 9), 8);
        assert_eq!(back.find("b", "y"), None);
        assert!(back.find("c", "w").is_some());
    }

    #[test]
    fn a_snapshot_of_the_first_layout_still_reads() {
        // Slots alone, as the first build with a window wrote them.
        let lo = FIXED_FINGERPRINT as u64;
        let hi = (FIXED_FINGERPRINT >> 64) as u64;
        let json = format!("[[{lo},{hi},{},1,7,70,5000]]", topic_hash("T"));
        let w: DedupWindow = serde_json::from_str(&json).unwrap();
        assert_eq!(w.find("T", "id"), Some(at(7, 70)));
        assert_eq!(w.clock.now_ms, 5000);
        // Bad input is an error, not a panic.
        for bad in ["{\"slots\": 3}", "{\"clock\": [1, null], \"x\": 1}", "[[1, 2]]", "7"] {
            assert!(serde_json::from_str::<DedupWindow>(bad).is_err(), "{bad}");
        }
    }
}
