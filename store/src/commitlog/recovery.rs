//! Start-up recovery of the CommitLog: find the segments, find the end of
//! valid data, and cut everything after it.
//!
//! The scan starts at the beginning of the segment holding the checkpoint's
//! `flushed` offset (everything before it was msynced before the checkpoint
//! was written) and verifies every record's length, magic and CRC. It stops
//! at the first record that fails, logs the offset and why, and wipes every
//! non-zero byte after it, deleting later segments. It never skips over a bad
//! record to look for good ones behind it: after a machine crash, pages reach
//! the disk in any order, so data behind a hole was never acknowledged as
//! durable and must not be resurrected.
//!
//! Without a usable checkpoint the scan starts at the first segment: slower,
//! equally correct (except that a log that was [`crate::CommitLog::reset`]
//! into the middle of a segment loses its start mark; the Raft layer then
//! re-fetches the log from its leader).

use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::Segment;
use crate::checkpoint::Checkpoint;
use crate::config::StoreConfig;
use crate::error::{IoContext, Result, StoreError};
use crate::layout::{ABORT_FILE, SPARE_SEGMENT_SUFFIX};
use crate::mapped_file::{MapOptions, MappedFile, offset_name, parse_offset_name, sync_dir};
use crate::record::{self, Decoded};

pub(crate) struct Recovered {
    pub segments: Vec<Arc<Segment>>,
    /// End of valid data: where the next record goes.
    pub end: u64,
    pub log_start: u64,
}

/// Lists and opens the segment files of `dir`, checking names, alignment
/// and contiguity.
fn open_segments(dir: &Path, cfg: &StoreConfig, map: MapOptions) -> Result<Vec<Arc<Segment>>> {
    let size = cfg.segment_size;
    let mut starts = Vec::new();
    for entry in fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".truncating") || name.ends_with(SPARE_SEGMENT_SUFFIX) {
            // A truncate that copied a segment died before its rename (the
            // original is intact), or a segment made ahead was never used.
            fs::remove_file(entry.path()).at(&entry.path())?;
            continue;
        }
        match parse_offset_name(&name) {
            Some(start) => starts.push(start),
            None => {
                tracing::warn!(file = %entry.path().display(), "ignoring unexpected file in the commitlog directory")
            }
        }
    }
    starts.sort_unstable();
    let mut segments = Vec::with_capacity(starts.len());
    for (i, &start) in starts.iter().enumerate() {
        let path = dir.join(offset_name(start));
        if start % size != 0 {
            return Err(StoreError::corrupt(
                &path,
                0,
                format!("segment start {start} is not a multiple of segment_size {size}"),
            ));
        }
        if i > 0 && start != starts[i - 1] + size {
            return Err(StoreError::corrupt(
                &path,
                0,
                format!("segments are not contiguous: {} is followed by {start}", starts[i - 1]),
            ));
        }
        let file = MappedFile::open(&path, size, map)?;
        segments.push(Arc::new(Segment { start, file }));
    }
    Ok(segments)
}

pub(crate) fn recover(
    dir: &Path,
    cfg: &StoreConfig,
    map: MapOptions,
    checkpoint: Option<Checkpoint>,
    crashed: bool,
) -> Result<Recovered> {
    let size = cfg.segment_size;
    let mut segments = open_segments(dir, cfg, map)?;
    if let (Some(c), Some(first), Some(last)) = (checkpoint, segments.first(), segments.last())
        && (c.log_start >= last.end() || c.log_start < first.start)
    {
        // A reset records its new start before it deletes the old
        // segments: this one died half-way. Finish it.
        tracing::warn!(
            log_start = c.log_start,
            "finishing an interrupted reset of the commitlog"
        );
        for s in segments.drain(..) {
            fs::remove_file(s.file.path()).at(s.file.path())?;
        }
        sync_dir(dir)?;
    }
    let (Some(first), Some(last)) = (segments.first(), segments.last()) else {
        let log_start = checkpoint.map(|c| c.log_start).unwrap_or(0);
        let start = log_start - log_start % size;
        let file = MappedFile::create(&dir.join(offset_name(start)), size, map)?;
        sync_dir(dir)?;
        return Ok(Recovered {
            segments: vec![Arc::new(Segment { start, file })],
            end: log_start,
            log_start,
        });
    };
    let (first_start, last_end) = (first.start, last.end());

    let mut log_start = first_start;
    let mut scan_from = first_start;
    if let Some(c) = checkpoint {
        if (first_start..last_end).contains(&c.log_start) {
            log_start = c.log_start;
        }
        // Everything before the segment holding the flushed mark was msynced;
        // the segment itself is always rescanned (never trusted whole, even
        // when the mark claims its end).
        let flushed = c.flushed.clamp(log_start, last_end - 1);
        scan_from = (flushed - flushed % size).max(log_start);
    }

    // Scan.
    let max = cfg.max_record_size as usize;
    let mut i = ((scan_from - first_start) / size) as usize;
    let mut p = scan_from;
    let mut records = 0u64;
    while let Some(seg) = segments.get(i) {
        let in_seg = p - seg.start;
        // SAFETY: nobody else has the segments yet.
        let buf = unsafe { seg.file.slice(in_seg, size - in_seg)? };
        match record::decode(buf, max) {
            Ok(Decoded::Record(v)) => {
                p += v.len as u64;
                records += 1;
            }
            Ok(Decoded::EndOfSegment) => {
                p = seg.end();
                i += 1;
            }
            Ok(Decoded::End) => break,
            Err(why) => {
                if !crashed {
                    // Everything was msynced at the clean stop: this is damage
                    // (a disk fault, a hand edit), not a torn write. Cutting
                    // here could drop records this node acknowledged, so a
                    // human decides.
                    let marker = dir.parent().unwrap_or(dir).join(ABORT_FILE);
                    return Err(StoreError::corrupt(
                        seg.file.path(),
                        p - seg.start,
                        format!(
                            "{why}, after a clean shutdown; to drop everything from here on and let the \
                             Raft group re-replicate it, create {} and restart",
                            marker.display()
                        ),
                    ));
                }
                tracing::warn!(offset = p, file = %seg.file.path().display(), %why, "torn or corrupt record after a crash; truncating here");
                break;
            }
        }
    }
    let end = p;

    // Wipe whatever follows the end, so it can never be mistaken for data.
    let keep = segments.iter().position(|s| s.start > end).unwrap_or(segments.len());
    if end < last_end {
        let seg = &segments[((end - first_start) / size) as usize];
        let in_seg = end - seg.start;
        // SAFETY: nobody else has the segments yet.
        let dirty = unsafe { seg.file.nonzero_end(in_seg)? };
        if dirty > in_seg {
            tracing::warn!(
                offset = end,
                bytes = dirty - in_seg,
                "wiping data after the end of the log"
            );
            // SAFETY: as above.
            unsafe { seg.file.zero(in_seg, dirty - in_seg)? };
            seg.file.flush(in_seg, dirty - in_seg)?;
        }
    }
    let dropped = segments.split_off(keep);
    for s in &dropped {
        tracing::warn!(file = %s.file.path().display(), "deleting segment after the end of the log");
        fs::remove_file(s.file.path()).at(s.file.path())?;
    }
    if !dropped.is_empty() {
        sync_dir(dir)?;
    }
    tracing::info!(from = scan_from, end, records, crashed, "commitlog recovered");
    Ok(Recovered {
        segments,
        end,
        log_start,
    })
}
