//! Sector-packed arrays of 20-byte units (ConsumeQueue units and key-index
//! entries).
//!
//! Units are laid out 25 to a 512-byte block (500 bytes of units, then 12
//! bytes of zero padding), so no unit ever straddles a 512-byte sector. Disks
//! write whole sectors atomically, so after a power loss every unit on disk is
//! either entirely old (zero) or entirely new: recovery never sees a torn
//! unit whose half-written fields look plausible. The cost is 2.3 % of space.
//!
//! ```text
//! block k (512 bytes): unit 25k | unit 25k+1 | ... | unit 25k+24 | 12 pad
//! ```

/// Size of one unit.
pub const UNIT_SIZE: u64 = 20;
/// The write-atomicity size assumed of the disk.
pub const BLOCK_SIZE: u64 = 512;
/// Units per block: `BLOCK_SIZE / UNIT_SIZE`, rounded down.
pub const UNITS_PER_BLOCK: u64 = BLOCK_SIZE / UNIT_SIZE;

/// Byte position of unit `i` within a file of packed units.
pub const fn unit_pos(i: u64) -> u64 {
    (i / UNITS_PER_BLOCK) * BLOCK_SIZE + (i % UNITS_PER_BLOCK) * UNIT_SIZE
}

/// Bytes needed for a file of `units` units (a multiple of whole blocks).
pub const fn file_len(units: u64) -> u64 {
    units.div_ceil(UNITS_PER_BLOCK) * BLOCK_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_never_cross_a_block() {
        for i in 0..10_000 {
            let p = unit_pos(i);
            assert_eq!(p / BLOCK_SIZE, (p + UNIT_SIZE - 1) / BLOCK_SIZE, "unit {i}");
            assert!(p + UNIT_SIZE <= file_len(i + 1));
        }
        assert_eq!(unit_pos(25), 512);
        assert_eq!(file_len(300_000), 300_000 / 25 * 512);
    }
}
