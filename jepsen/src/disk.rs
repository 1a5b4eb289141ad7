//! The `disk-full` nemesis's filesystems: with it, each node's data lives on
//! a tmpfs of its own, [`DISK_BYTES`] large, which the nemesis fills with a
//! file of its own and later deletes.
//!
//! | fill | what is left free |
//! |---|---|
//! | `to the last byte` | nothing: every write that needs a new page fails with `ENOSPC` |
//! | `past the watermark` | a little (the fill stops at [`PAST_WATERMARK`] of the filesystem): the broker's `disk_refuse_ratio` decides, nothing fails yet |
//!
//! The filler is `FILL_NAME` at the filesystem's root (the data directory,
//! or the LazyFs backing directory under the power nemesis, so it takes
//! space at once). The broker's files are preallocated, so writes into
//! them go on; a new segment, index file, snapshot or metadata file is what
//! a full disk refuses.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Each node's filesystem size under the disk-full nemesis.
pub const DISK_BYTES: u64 = 256 << 20;
/// What `past the watermark` fills the filesystem to: above the brokers'
/// `disk_refuse_ratio` in these runs (0.9), short of full.
pub const PAST_WATERMARK: f64 = 0.95;
/// The filler's name at the filesystem's root.
pub const FILL_NAME: &str = "jepsen-disk-fill";

/// A tmpfs mounted for one node, unmounted when dropped.
pub struct Tmpfs {
    mountpoint: PathBuf,
}

impl Tmpfs {
    /// Mounts an empty tmpfs of `bytes` on `mountpoint` (which must exist).
    pub fn mount(mountpoint: &Path, bytes: u64) -> anyhow::Result<Tmpfs> {
        let m = mountpoint.to_str().context("mount point is not UTF-8")?;
        crate::netns::run(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            &format!("size={bytes},mode=0755"),
            "tmpfs",
            m,
        ])?;
        Ok(Tmpfs {
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.mountpoint
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a node's process may still be on its way out.
        if let Err(e) = crate::netns::run(&["umount", "-l", &self.mountpoint.display().to_string()]) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Used and total bytes of the filesystem holding `dir`, as `statvfs`
/// counts them (total minus available to an unprivileged writer: what the
/// broker's watermarks see).
pub fn usage(dir: &Path) -> io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed out-struct.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let total = st.f_blocks as u64 * st.f_frsize as u64;
    let avail = st.f_bavail as u64 * st.f_frsize as u64;
    Ok((total - avail.min(total), total))
}

/// How a fill went: bytes written, and the filesystem's use after it.
pub struct Filled {
    pub bytes: u64,
    pub used: u64,
    pub total: u64,
}

impl std::fmt::Display for Filled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} MiB written, disk {:.1} % used ({} of {} KiB)",
            self.bytes >> 20,
            self.used as f64 * 100.0 / self.total.max(1) as f64,
            self.used >> 10,
            self.total >> 10
        )
    }
}

/// Fills the filesystem at `root`: to the last byte (`to_the_last_byte`)
/// or to [`PAST_WATERMARK`] of it.
pub fn fill(root: &Path, to_the_last_byte: bool) -> anyhow::Result<Filled> {
    let path = root.join(FILL_NAME);
    let mut f = File::options()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let (used, total) = usage(root)?;
    let mut budget = if to_the_last_byte {
        u64::MAX
    } else {
        ((total as f64 * PAST_WATERMARK) as u64).saturating_sub(used)
    };
    // Non-zero bytes: a filesystem that skipped zero pages would not fill.
    let chunk = vec![0xa5u8; 1 << 20];
    let mut bytes = 0u64;
    // Down to single pages, so that "full" leaves not one page free.
    let mut size = chunk.len();
    while size >= 4096 && budget > 0 {
        let n = size.min(usize::try_from(budget).unwrap_or(usize::MAX));
        match f.write(&chunk[..n]) {
            Ok(0) => size /= 2,
            Ok(w) => {
                bytes += w as u64;
                budget -= w as u64;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => size /= 2,
            Err(e) => return Err(e).with_context(|| format!("writing {}", path.display())),
        }
    }
    let (used, total) = usage(root)?;
    Ok(Filled { bytes, used, total })
}

/// Deletes the filler (a no-op when there is none).
pub fn free(root: &Path) -> anyhow::Result<()> {
    match fs::remove_file(root.join(FILL_NAME)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", root.join(FILL_NAME).display()))
        }
        _ => Ok(()),
    }
}
