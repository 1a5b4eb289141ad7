//! A FUSE pass-through filesystem that loses writes not yet fsynced, after
//! Jepsen's LazyFS: the "lost un-fsynced writes on kill" fault. A node's data
//! directory is served through it; killing the node and calling
//! [`LazyFs::lose_unsynced`] then leaves on disk only what the node had made
//! durable, as a power loss would, where a plain `kill -9` leaves everything
//! it wrote in the host's page cache.
//!
//! How it works: `mount` serves `backing` (a real directory) at `mountpoint`
//! through a `fuser` session (pure-Rust mount: `mount(2)` as root, else
//! `fusermount3`; no libfuse). Every request is applied to the backing
//! directory except file data: a FUSE WRITE only lands in memory. FSYNC (fsync
//! or fdatasync, and msync(MS_SYNC), which the kernel turns into the dirty
//! pages' WRITEs followed by an FSYNC) writes the file's pending data to the
//! backing file with `pwrite` and fsyncs it. `lose_unsynced` unmounts (the
//! kernel first writes every dirty page back to us), forgets what is pending
//! and mounts again.
//!
//! Pending state, per inode: a map from 4 KiB page index to the page's full
//! content (a page first written partially is filled from the backing file),
//! plus `end`, the end of the furthest pending write. A read is the backing
//! file's bytes overlaid with the pending pages; the size is the larger of the
//! backing file's size and `end`. A pending page's bytes past the file's size
//! are zero, so truncating or extending needs no more than trimming pages.
//! An fsync writes runs of consecutive pending pages (never whole files), so a
//! 64 MiB segment msynced a little at a time costs what was written.
//!
//! Inodes are numbered in this daemon: a table maps inode numbers to paths
//! relative to the backing directory, updated on rename (with the renamed
//! directory's descendants) and unlink. Pending data hangs off the inode, so a
//! renamed file keeps it; an unlinked file's pending data lives while it is
//! open and is dropped after.
//!
//! Simplifications, against LazyFS proper:
//! - Metadata is durable at once: create, mknod, mkdir, unlink, rmdir, rename,
//!   symlink, chmod/chown/utimes, truncate and fallocate go straight to the
//!   backing directory, where LazyFS can also lose them. A truncate or an
//!   extending fallocate therefore survives a loss even if not fsynced (the
//!   file keeps its new size, zero-filled where data was lost).
//! - An fsync makes all of the file's pending data durable, whatever range the
//!   caller gave (FUSE FSYNC carries none): `msync` of one range also saves
//!   other dirty ranges that the kernel had already written back to us.
//! - No hard links (link returns EPERM), no extended attributes (ENOSYS, so
//!   the kernel answers EOPNOTSUPP), file locks are handled by the kernel.
//! - The daemon runs one request at a time (one session thread).
//! - A backing file's mtime moves when its data is fsynced, not at write().
//! - As root (the harness) backing files are always opened read-write; other
//!   users fall back to the caller's access mode where the file's mode says so.
//!
//! The kernel side: no `direct_io` (so mmap works) and no writeback cache
//! (the FUSE default), so each write() reaches the daemon before it returns.
//! Dirty pages of shared writable maps reach us as WRITEs at msync, at
//! munmap/exit (FUSE writes them back when a map is closed), at background
//! writeback or at unmount, and stay pending until an FSYNC. Files are opened
//! with `keep_cache`: every change goes through this mount, so the kernel's
//! page cache stays coherent with what we serve.
//!
//! The process that owns a `LazyFs` must not itself map files of the mount:
//! munmap writes dirty pages back while holding the process's mm lock, which
//! the serving thread needs as soon as it grows its heap, and both hang (seen
//! on Linux 6.18). Other processes (the nodes) may; the tests map files in
//! forked children for that reason. `lose_unsynced` and `unmount` block (they
//! wait for the kernel and for a busy mount): call them off async threads.

// The harness integrates the API; until then only the tests call it.
#![cfg_attr(not(test), allow(dead_code))]

mod fuse;
mod pending;
mod state;
#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fuser::{BackgroundSession, MountOption};

use fuse::Lazy;
pub use state::LossReport;
use state::{State, lock};

/// How long an unmount waits for the mount to stop being busy (a killed
/// process's files close as it exits).
const UNMOUNT_PATIENCE: Duration = Duration::from_secs(10);

/// How long an unmount may take with its session ending, before the FUSE
/// connection is aborted: past [`UNMOUNT_PATIENCE`], so that a mount still
/// busy (and left mounted when the unmount gives up) is never aborted. Every node's process runs in a mount namespace
/// of its own that holds a copy of every LazyFS mount of the run (and of
/// other runs on the host); campaigns saw an unmount whose session never
/// ended until those processes did, which stalled the nemesis for the
/// rest of the run. Aborting ends the session; what the kernel had not
/// handed over is lost, as a power loss loses it.
const SESSION_PATIENCE: Duration = Duration::from_secs(15);
const _: () = assert!(SESSION_PATIENCE.as_secs() > UNMOUNT_PATIENCE.as_secs());

/// Where the kernel lists FUSE connections (the `fusectl` filesystem).
const FUSE_CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// A mounted lazy filesystem; see the module docs.
pub struct LazyFs {
    backing: PathBuf,
    mountpoint: PathBuf,
    state: Arc<Mutex<State>>,
    /// `None` once unmounted (or when a remount failed).
    session: Option<BackgroundSession>,
}

impl LazyFs {
    /// Mounts at `mountpoint` (an existing empty directory) a filesystem mirroring `backing` (an existing directory).
    pub fn mount(backing: &Path, mountpoint: &Path) -> anyhow::Result<LazyFs> {
        check_prerequisites()?;
        let backing = backing
            .canonicalize()
            .with_context(|| format!("lazyfs backing directory {}", backing.display()))?;
        let mountpoint = mountpoint
            .canonicalize()
            .with_context(|| format!("lazyfs mountpoint {}", mountpoint.display()))?;
        if !backing.is_dir() {
            bail!("lazyfs backing {} is not a directory", backing.display());
        }
        if !mountpoint.is_dir() {
            bail!("lazyfs mountpoint {} is not a directory", mountpoint.display());
        }
        let state = Arc::new(Mutex::new(State::new(backing.clone())));
        let session = spawn(&state, &mountpoint)?;
        Ok(LazyFs {
            backing,
            mountpoint,
            state,
            session: Some(session),
        })
    }

    /// Simulates a power loss: unmounts (the kernel first writes back dirty pages, including those of shared mmaps, to the daemon), drops every write that was not fsynced, and mounts again. Call when no process uses the mount (after kill -9 of the node).
    pub fn lose_unsynced(&mut self) -> anyhow::Result<LossReport> {
        self.unmount_session()?;
        let report = {
            let mut state = lock(&self.state);
            let report = state.loss_report();
            *state = State::new(self.backing.clone());
            report
        };
        self.session = Some(spawn(&self.state, &self.mountpoint)?);
        Ok(report)
    }

    /// Writes every pending write to the backing files (no loss) and unmounts.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        self.unmount_session()?;
        self.flush_all()
    }

    /// Unmounts and waits for the session thread to end, so that every dirty
    /// page the kernel held has been handed to us. On failure (still busy),
    /// stays mounted.
    fn unmount_session(&mut self) -> anyhow::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if session.guard.is_finished() {
            // Ended already: unmounted by someone else.
            return session
                .join()
                .with_context(|| format!("lazyfs session at {} ended with an error", self.mountpoint.display()));
        }
        let watchdog = Watchdog::start(&self.mountpoint);
        if let Err(e) = umount(&self.mountpoint) {
            watchdog.stop();
            self.session = Some(session);
            return Err(e);
        }
        let ended = session.join();
        if !watchdog.stop() {
            return ended
                .with_context(|| format!("lazyfs session at {} ended with an error", self.mountpoint.display()));
        }
        // The abort ends the session with an error of its own.
        eprintln!(
            "lazyfs: the session at {} did not end within {SESSION_PATIENCE:?} of its unmount; \
             its connection was aborted ({})",
            self.mountpoint.display(),
            ended
                .err()
                .map_or_else(|| "it then ended cleanly".to_string(), |e| e.to_string())
        );
        Ok(())
    }

    /// Writes every file's pending data to its backing file and fsyncs it.
    fn flush_all(&self) -> anyhow::Result<()> {
        let mut state = lock(&self.state);
        let inos: Vec<u64> = state
            .inodes
            .iter()
            .filter(|(_, i)| !i.pending.is_empty())
            .map(|(&n, _)| n)
            .collect();
        let mut failed = 0;
        for ino in inos {
            // An unlinked file that nobody holds open has nowhere to go.
            if state
                .inodes
                .get(&ino)
                .is_some_and(|i| i.path.is_none() && i.file.is_none())
            {
                continue;
            }
            if state.sync_inode(ino, false).is_err() {
                failed += 1;
            }
        }
        if failed > 0 {
            bail!(
                "lazyfs: {failed} files' pending writes could not be written to {}",
                self.backing.display()
            );
        }
        Ok(())
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if self.session.is_none() {
            return;
        }
        if let Err(e) = self.unmount_session() {
            eprintln!("lazyfs: {e:#}; leaving {} mounted", self.mountpoint.display());
            // Dropping the session detaches its thread; keep what it got so far.
            self.session = None;
        }
        if let Err(e) = self.flush_all() {
            eprintln!("{e:#}");
        }
    }
}

// The harness may hold a `LazyFs` across awaits and move it to blocking threads.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<LazyFs>();
};

/// Fails with what is missing when this machine cannot mount FUSE filesystems.
fn check_prerequisites() -> anyhow::Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("lazyfs needs /dev/fuse (the fuse kernel module; in a container, the device must be passed in)");
    }
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        bail!("lazyfs cannot open /dev/fuse: {e} (run as root, or give this user the device)");
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && find_in_path("fusermount3").is_none() {
        bail!("lazyfs needs root, or fusermount3 (Debian package fuse3) to mount as another user");
    }
    Ok(())
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Mounts a fresh session serving `state` at `mountpoint`.
fn spawn(state: &Arc<Mutex<State>>, mountpoint: &Path) -> anyhow::Result<BackgroundSession> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("lazyfs".to_string()),
        MountOption::Subtype("lazyfs".to_string()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    let fs = Lazy { state: state.clone() };
    fuser::spawn_mount(fs, mountpoint, &config).with_context(|| {
        format!(
            "mounting lazyfs at {} (needs /dev/fuse, and root or fusermount3 from fuse3)",
            mountpoint.display()
        )
    })
}

/// Aborts a mount's FUSE connection if an unmount and the end of its
/// session take longer than [`SESSION_PATIENCE`].
struct Watchdog {
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<bool>,
}

impl Watchdog {
    fn start(mountpoint: &Path) -> Watchdog {
        // The connection's name is the mount's device number, read while
        // it is still mounted.
        let abort = fuse_connection(mountpoint).map(|id| Path::new(FUSE_CONNECTIONS).join(id).join("abort"));
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if wait.recv_timeout(SESSION_PATIENCE) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return false;
            }
            match &abort {
                Some(path) => std::fs::write(path, "1")
                    .map_err(|e| eprintln!("lazyfs: aborting the connection at {}: {e}", path.display()))
                    .is_ok(),
                None => false,
            }
        });
        Watchdog { done, thread }
    }

    /// Whether it aborted the connection.
    fn stop(self) -> bool {
        let _ = self.done.send(());
        self.thread.join().unwrap_or(false)
    }
}

/// The `fusectl` name of the FUSE connection mounted at `mountpoint` (its
/// device number as the kernel writes it), mounting `fusectl` if needed;
/// `None` when it cannot be found.
fn fuse_connection(mountpoint: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let id = ((u64::from(major) << 20) | u64::from(minor)).to_string();
    let dir = Path::new(FUSE_CONNECTIONS);
    if !dir.join(&id).exists() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "fusectl", FUSE_CONNECTIONS])
            .output();
    }
    dir.join(&id).exists().then_some(id)
}

/// A plain (not lazy) unmount, so that the kernel writes dirty pages back
/// first; waits while the mount is busy.
fn umount(mountpoint: &Path) -> anyhow::Result<()> {
    let c = CString::new(mountpoint.as_os_str().as_bytes()).context("mountpoint path with a NUL byte")?;
    let deadline = Instant::now() + UNMOUNT_PATIENCE;
    loop {
        // SAFETY: `c` is a valid NUL-terminated path.
        let err = if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(());
        } else {
            io::Error::last_os_error()
        };
        match err.raw_os_error() {
            Some(libc::EBUSY) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Some(libc::EINTR) => {}
            // Not root: the setuid helper may unmount what its user mounted.
            Some(libc::EPERM) => {
                let out = Command::new("fusermount3")
                    .arg("-u")
                    .arg("--")
                    .arg(mountpoint)
                    .output()
                    .context("running fusermount3 -u")?;
                if out.status.success() {
                    return Ok(());
                }
                let stderr = String::from_utf8_lossy(&out.stderr);
                if !stderr.contains("busy") || Instant::now() >= deadline {
                    bail!("fusermount3 -u {} failed: {}", mountpoint.display(), stderr.trim());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => return Err(err).with_context(|| format!("unmounting lazyfs at {}", mountpoint.display())),
        }
    }
}
