//! Sector-packed arrays of 20-byte units (ConsumeQueue units and key-index
//! entries), and the seal that lets a reader tell a damaged block.
//!
//! Units are laid out 25 to a 512-byte block (500 bytes of units, then 12
//! bytes of seal), so no unit ever straddles a 512-byte sector. Disks write
//! whole sectors atomically, so after a power loss every unit on disk is
//! either entirely old (zero) or entirely new: recovery never sees a torn
//! unit whose half-written fields look plausible. The cost is 2.3 % of space.
//!
//! ```text
//! block k (512 bytes): unit 25k | unit 25k+1 | ... | unit 25k+24 | seal (12)
//!
//! seal: offset 0  4 bytes  SEAL_MAGIC ("RCQ1")
//!              4  4 bytes  CRC32 (crc32fast, IEEE) of the block's 500 unit bytes, LE
//!              8  4 bytes  zero
//! ```
//!
//! Both arrays (ConsumeQueue and key-index entries) write a unit, then the
//! seal of its block anew, so a flipped bit anywhere in a block is found
//! when the block is read ([`check_block`]). A seal of all zeros is an
//! unsealed block, one written before seals existed: it is read unchecked.
//! Anything else in those 12 bytes is damage.
//!
//! After a crash the disk may hold a block whose seal is older than its
//! units (the unit reached the disk, the seal written after it did not), so
//! recovery accepts the seal of any prefix of the block's units
//! ([`seal_fits_a_prefix`]); a block below the durable mark was made
//! durable whole, so only a unit above it can be left out that way.

use crate::error::{Result, StoreError};
use crate::mapped_file::MappedFile;

/// Size of one unit.
pub const UNIT_SIZE: u64 = 20;
/// The write-atomicity size assumed of the disk.
pub const BLOCK_SIZE: u64 = 512;
/// Units per block: `BLOCK_SIZE / UNIT_SIZE`, rounded down.
pub const UNITS_PER_BLOCK: u64 = BLOCK_SIZE / UNIT_SIZE;

/// Bytes of units in one block.
pub const UNIT_BYTES: u64 = UNITS_PER_BLOCK * UNIT_SIZE;
/// Bytes of the seal after them.
pub const SEAL_LEN: u64 = BLOCK_SIZE - UNIT_BYTES;
/// First bytes of a seal.
pub const SEAL_MAGIC: [u8; 4] = *b"RCQ1";

/// What a block's seal says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    /// All zeros: not sealed (read unchecked).
    Unsealed,
    /// The CRC32 of the block's unit bytes when it was sealed.
    Sealed(u32),
    /// Neither: the seal itself is damaged.
    Damaged,
}

impl Seal {
    /// Reads the [`SEAL_LEN`] bytes after a block's units.
    pub fn read(bytes: &[u8]) -> Seal {
        if bytes.iter().all(|&b| b == 0) {
            return Seal::Unsealed;
        }
        match bytes {
            [m0, m1, m2, m3, c0, c1, c2, c3, 0, 0, 0, 0] if [*m0, *m1, *m2, *m3] == SEAL_MAGIC => {
                Seal::Sealed(u32::from_le_bytes([*c0, *c1, *c2, *c3]))
            }
            _ => Seal::Damaged,
        }
    }
}

/// Zeros as long as a block's units.
const ZEROS: [u8; UNIT_BYTES as usize] = [0; UNIT_BYTES as usize];

/// The CRC32 of a block's unit bytes `units` once every unit from the
/// `n`-th on is zeroed (`n >= UNITS_PER_BLOCK`: as they are).
fn prefix_crc(units: &[u8], n: u64) -> u32 {
    let cut = ((n * UNIT_SIZE) as usize).min(units.len());
    let mut h = crc32fast::Hasher::new();
    h.update(&units[..cut]);
    h.update(&ZEROS[..units.len() - cut]);
    h.finalize()
}

/// The seal of a block whose unit bytes are `units` once every unit from
/// the `n`-th on is zeroed (`UNITS_PER_BLOCK`: as they are). Truncation
/// writes it before the zeroing, so that a crash between the two leaves the
/// seal of a prefix (see [`seal_fits_a_prefix`]).
pub fn seal_of_prefix(units: &[u8], n: u64) -> [u8; SEAL_LEN as usize] {
    let mut s = [0u8; SEAL_LEN as usize];
    s[..4].copy_from_slice(&SEAL_MAGIC);
    s[4..8].copy_from_slice(&prefix_crc(units, n).to_le_bytes());
    s
}

/// Whether a block's seal (`seal_bytes`) fits its unit bytes (`units`)
/// exactly: unsealed, or sealed with their CRC.
pub fn seal_fits(units: &[u8], seal_bytes: &[u8]) -> bool {
    match Seal::read(seal_bytes) {
        Seal::Unsealed => true,
        Seal::Sealed(crc) => crc32fast::hash(units) == crc,
        Seal::Damaged => false,
    }
}

/// Whether a block's seal fits the block as it was when only its first `n`
/// units were written, for some `n <= present`: what a crash can leave
/// (see the module docs).
pub fn seal_fits_a_prefix(units: &[u8], seal_bytes: &[u8], present: u64) -> bool {
    match Seal::read(seal_bytes) {
        Seal::Unsealed => true,
        Seal::Sealed(crc) => (0..=present.min(UNITS_PER_BLOCK)).any(|n| prefix_crc(units, n) == crc),
        Seal::Damaged => false,
    }
}

/// How a block's seal is checked ([`check_block`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fit {
    /// Exactly: the block was written whole (durable, or in memory).
    Exact,
    /// As a crash may leave it: the seal of some prefix of at most this
    /// many of its units.
    Prefix(u64),
}

/// The unit bytes and the seal of the block holding unit `i` of an array
/// that starts at byte `base` of `file`.
///
/// # Safety
/// No write to the block may happen while the slices are alive.
pub(crate) unsafe fn block_of(file: &MappedFile, base: u64, i: u64) -> Result<(&[u8], &[u8])> {
    // SAFETY: forwarded to the caller.
    let block = unsafe { file.slice(base + block_pos(i), BLOCK_SIZE)? };
    Ok(block.split_at(UNIT_BYTES as usize))
}

/// Checks the seal of the block holding unit `i` (array at `base`);
/// `Corrupt`, naming the block, when it does not fit.
///
/// # Safety
/// As for [`block_of`].
pub(crate) unsafe fn check_block(file: &MappedFile, base: u64, i: u64, fit: Fit) -> Result<()> {
    // SAFETY: forwarded to the caller.
    let (units, seal) = unsafe { block_of(file, base, i)? };
    let fits = match fit {
        Fit::Exact => seal_fits(units, seal),
        Fit::Prefix(present) => seal_fits_a_prefix(units, seal, present),
    };
    if fits {
        return Ok(());
    }
    Err(StoreError::corrupt(
        file.path(),
        base + block_pos(i),
        format!("the block holding unit {i} does not match its seal (a unit or the seal is damaged)"),
    ))
}

/// Seals the block holding unit `i` (array at `base`) anew for its first
/// `n` units as they are now, the rest counted as zero
/// ([`UNITS_PER_BLOCK`]: all of them).
///
/// # Safety
/// Only the array's single writer may call it, and no reader may read the
/// block's seal meanwhile.
pub(crate) unsafe fn reseal(file: &MappedFile, base: u64, i: u64, n: u64) -> Result<()> {
    // SAFETY: the writer reads bytes only it writes; the slice dies before
    // the write, which the caller makes exclusive.
    unsafe {
        let seal = seal_of_prefix(block_of(file, base, i)?.0, n);
        file.write(base + block_pos(i) + UNIT_BYTES, &seal)
    }
}

/// Byte position of the block holding unit `i`.
pub const fn block_pos(i: u64) -> u64 {
    (i / UNITS_PER_BLOCK) * BLOCK_SIZE
}

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
        assert_eq!(UNIT_BYTES + SEAL_LEN, BLOCK_SIZE);
    }

    #[test]
    fn a_seal_tells_damage_and_a_crash_from_each_other() {
        let mut units = [0u8; UNIT_BYTES as usize];
        assert_eq!(Seal::read(&[0; 12]), Seal::Unsealed);
        assert!(seal_fits(&units, &[0; 12]));
        // Three units, sealed after each: every older seal fits a prefix.
        let mut seals = Vec::new();
        for i in 0..3 {
            units[i * 20..i * 20 + 20].fill(i as u8 + 1);
            seals.push(seal_of_prefix(&units, UNITS_PER_BLOCK));
        }
        assert!(seal_fits(&units, &seals[2]));
        assert!(!seal_fits(&units, &seals[1]), "an older seal is not exact");
        assert!(seal_fits_a_prefix(&units, &seals[1], 3), "but fits a prefix");
        assert!(
            !seal_fits_a_prefix(&units, &seals[1], 1),
            "not one shorter than `present`"
        );
        assert_eq!(seal_of_prefix(&units, 2), seals[1]);
        assert_eq!(seal_of_prefix(&units, 25), seals[2]);
        // A flipped bit in a unit or in the seal is damage.
        let mut flipped = units;
        flipped[25] ^= 0x10;
        assert!(!seal_fits(&flipped, &seals[2]));
        assert!(!seal_fits_a_prefix(&flipped, &seals[2], 3));
        let mut bad_seal = seals[2];
        bad_seal[1] ^= 1;
        assert_eq!(Seal::read(&bad_seal), Seal::Damaged);
        assert!(!seal_fits_a_prefix(&units, &bad_seal, 3));
        bad_seal = seals[2];
        bad_seal[10] = 1;
        assert_eq!(Seal::read(&bad_seal), Seal::Damaged);
    }
}
