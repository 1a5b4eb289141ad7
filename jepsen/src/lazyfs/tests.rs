//! LazyFs against a real FUSE mount: what survives a loss and what does
//! not, mmap'd writes from forked children, renames, unlinks, sizes.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::Instant;

use memmap2::MmapMut;

use super::state::*;
use super::*;

/// A backing and a mount directory in a fresh temporary directory.
struct Dirs {
    backing: PathBuf,
    mnt: PathBuf,
    // Last: removed after the mount is gone.
    _tmp: tempfile::TempDir,
}

/// An empty file, open for reading and writing.
fn new_file(path: &Path) -> std::fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap()
}

fn dirs() -> Dirs {
    let tmp = tempfile::Builder::new()
        .prefix("lazyfs-test-")
        .tempdir()
        .expect("temporary directory");
    let (backing, mnt) = (tmp.path().join("backing"), tmp.path().join("mnt"));
    fs::create_dir(&backing).expect("backing directory");
    fs::create_dir(&mnt).expect("mount directory");
    Dirs {
        backing,
        mnt,
        _tmp: tmp,
    }
}

/// Mounting is required: without it the tests fail, naming what is missing.
fn mount(d: &Dirs) -> LazyFs {
    LazyFs::mount(&d.backing, &d.mnt)
        .unwrap_or_else(|e| panic!("lazyfs tests need FUSE (root or fusermount3 from fuse3, and /dev/fuse): {e:#}"))
}

/// Runs `f` in a forked child and returns its exit code. Mapped writes
/// must come from another process than the one serving the mount (see the
/// module docs); the child only makes system calls, nothing that could
/// wait for a lock another thread of ours held at fork.
fn in_child(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `f` (system calls only) and exits without unwinding.
    match unsafe { libc::fork() } {
        -1 => panic!("fork: {}", io::Error::last_os_error()),
        0 => {
            let code = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(101);
            unsafe { libc::_exit(code) }
        }
        pid => {
            let mut status = 0;
            loop {
                // SAFETY: our own child; `status` is a valid out-parameter.
                if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
                    break;
                }
                let e = io::Error::last_os_error();
                assert_eq!(e.kind(), io::ErrorKind::Interrupted, "waitpid: {e}");
            }
            if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            }
        }
    }
}

fn fallocate(file: &File, len: i64) {
    // SAFETY: a valid descriptor.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    assert_eq!(r, 0, "posix_fallocate: {}", io::Error::from_raw_os_error(r));
}

#[test]
fn lose_unsynced_drops_unsynced_data_and_keeps_fsynced_data() {
    let d = dirs();
    let mut lazy = mount(&d);
    let (unsynced, synced, rewritten) = (d.mnt.join("unsynced"), d.mnt.join("synced"), d.mnt.join("rewritten"));

    fs::write(&unsynced, b"hello, page cache").unwrap();
    let mut f = File::create(&synced).unwrap();
    f.write_all(b"hello, disk").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut f = File::create(&rewritten).unwrap();
    f.write_all(b"version 1").unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b"VERSION 2", 0).unwrap();
    drop(f);

    // Read-after-write sees everything; the backing files only what was fsynced.
    assert_eq!(fs::read(&unsynced).unwrap(), b"hello, page cache");
    assert_eq!(fs::read(&synced).unwrap(), b"hello, disk");
    assert_eq!(fs::read(&rewritten).unwrap(), b"VERSION 2");
    assert_eq!(fs::metadata(&unsynced).unwrap().len(), 17);
    assert_eq!(fs::read(d.backing.join("unsynced")).unwrap(), b"");
    assert_eq!(fs::read(d.backing.join("synced")).unwrap(), b"hello, disk");

    let report = lazy.lose_unsynced().unwrap();
    assert_eq!(report.files, 2, "{report:?}");
    assert!(report.bytes >= 17 + 9, "{report:?}");

    // The files exist (metadata is durable) with their last fsynced content.
    assert_eq!(fs::read(&unsynced).unwrap(), b"");
    assert_eq!(fs::read(&synced).unwrap(), b"hello, disk");
    assert_eq!(fs::read(&rewritten).unwrap(), b"version 1");
    // Nothing left to lose.
    assert_eq!(lazy.lose_unsynced().unwrap(), LossReport::default());
    lazy.unmount().unwrap();
}

#[test]
fn fsynced_prefix_survives_and_truncate_and_rename_carry_pending_data() {
    let d = dirs();
    let mut lazy = mount(&d);

    // fsync, then more writes: only the fsynced prefix survives.
    let log = d.mnt.join("log");
    let mut f = OpenOptions::new().create(true).append(true).open(&log).unwrap();
    f.write_all(&[b'a'; 10_000]).unwrap();
    f.sync_data().unwrap();
    f.write_all(&[b'b'; 10_000]).unwrap();
    drop(f);
    let mut expected = vec![b'a'; 10_000];
    expected.extend([b'b'; 10_000]);
    assert_eq!(fs::read(&log).unwrap(), expected);

    // A truncate trims pending pages: extending again reads zeros.
    let cut = d.mnt.join("cut");
    let f = File::create(&cut).unwrap();
    f.write_all_at(&[b'q'; 8192], 0).unwrap();
    f.set_len(100).unwrap();
    f.set_len(8192).unwrap();
    let mut expected_cut = vec![b'q'; 100];
    expected_cut.resize(8192, 0);
    assert_eq!(fs::read(&cut).unwrap(), expected_cut);
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(d.backing.join("cut")).unwrap(), expected_cut);

    // A truncate of unsynced data is durable metadata: the size stays, the data goes.
    let shrunk = d.mnt.join("shrunk");
    let f = File::create(&shrunk).unwrap();
    f.write_all_at(&[b'x'; 6000], 0).unwrap();
    f.sync_all().unwrap();
    f.write_all_at(&[b'y'; 6000], 6000).unwrap();
    f.set_len(9000).unwrap();
    drop(f);
    let mut expected_shrunk = vec![b'x'; 6000];
    expected_shrunk.extend([b'y'; 3000]);
    assert_eq!(fs::read(&shrunk).unwrap(), expected_shrunk);

    // Renamed files (and files in renamed directories) keep their pending data.
    fs::write(d.mnt.join("meta.tmp"), b"term=7").unwrap();
    fs::rename(d.mnt.join("meta.tmp"), d.mnt.join("meta")).unwrap();
    assert_eq!(fs::read(d.mnt.join("meta")).unwrap(), b"term=7");
    File::open(d.mnt.join("meta")).unwrap().sync_all().unwrap();
    fs::create_dir(d.mnt.join("dir")).unwrap();
    fs::write(d.mnt.join("dir/inner"), b"inner data").unwrap();
    fs::rename(d.mnt.join("dir"), d.mnt.join("moved")).unwrap();
    File::open(d.mnt.join("moved/inner")).unwrap().sync_all().unwrap();
    fs::write(d.mnt.join("lost.tmp"), b"never synced").unwrap();
    fs::rename(d.mnt.join("lost.tmp"), d.mnt.join("lost")).unwrap();
    // Renamed over: the old file's pending data goes with it.
    fs::write(d.mnt.join("over"), b"old").unwrap();
    fs::write(d.mnt.join("over.tmp"), b"new").unwrap();
    File::open(d.mnt.join("over.tmp")).unwrap().sync_all().unwrap();
    fs::rename(d.mnt.join("over.tmp"), d.mnt.join("over")).unwrap();

    let report = lazy.lose_unsynced().unwrap();
    assert_eq!(report.files, 3, "log, shrunk and lost: {report:?}");

    assert_eq!(fs::read(&log).unwrap(), vec![b'a'; 10_000]);
    assert_eq!(fs::read(&cut).unwrap(), expected_cut);
    let mut expected_shrunk = vec![b'x'; 6000];
    expected_shrunk.resize(9000, 0);
    assert_eq!(fs::read(&shrunk).unwrap(), expected_shrunk);
    assert_eq!(fs::read(d.mnt.join("meta")).unwrap(), b"term=7");
    assert_eq!(fs::read(d.mnt.join("moved/inner")).unwrap(), b"inner data");
    assert_eq!(fs::read(d.mnt.join("lost")).unwrap(), b"");
    assert_eq!(fs::read(d.mnt.join("over")).unwrap(), b"new");
    assert!(!d.mnt.join("meta.tmp").exists() && !d.mnt.join("dir").exists());
    lazy.unmount().unwrap();
}

#[test]
fn mmap_msynced_range_survives_and_unflushed_pages_are_lost() {
    const LEN: usize = 1 << 20;
    let d = dirs();
    let mut lazy = mount(&d);
    let path = d.mnt.join("segment");
    let file = new_file(&path);
    fallocate(&file, LEN as i64);
    assert_eq!(file.metadata().unwrap().len(), LEN as u64);

    let code = in_child(|| {
        // SAFETY: nothing else maps or truncates the file meanwhile.
        let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
            return 2;
        };
        map[100..200].fill(1);
        map[4000..4200].fill(2);
        if map.flush_range(0, 8192).is_err() {
            return 3;
        }
        map[300_000..300_100].fill(3);
        map[LEN - 10..].fill(4);
        0
    });
    assert_eq!(code, 0, "child failed");
    // As the node dies: kill -9 with a dirty map.
    let code = in_child(|| {
        // SAFETY: nothing else maps or truncates the file meanwhile.
        let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
            return 2;
        };
        map[600_000..600_100].fill(5);
        // SAFETY: kills this (child) process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        4
    });
    assert_eq!(code, 128 + libc::SIGKILL, "child not killed");
    // The unmaps wrote the unflushed pages back to the daemon: readable, not durable.
    let data = fs::read(&path).unwrap();
    assert!(data[300_000..300_100].iter().all(|&b| b == 3));
    assert!(data[600_000..600_100].iter().all(|&b| b == 5));
    assert!(data[LEN - 10..].iter().all(|&b| b == 4));
    drop(file);

    let report = lazy.lose_unsynced().unwrap();
    assert_eq!(report.files, 1, "{report:?}");
    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), LEN);
    assert!(data[100..200].iter().all(|&b| b == 1));
    assert!(data[4000..4200].iter().all(|&b| b == 2));
    let nonzero = data
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != 0 && !(100..200).contains(&i));
    assert_eq!(nonzero.count(), 200, "only the msynced bytes are left");
    lazy.unmount().unwrap();
}

#[test]
fn unmount_writes_every_pending_write() {
    let d = dirs();
    let lazy = mount(&d);
    fs::create_dir(d.mnt.join("sub")).unwrap();
    fs::write(d.mnt.join("sub/plain"), b"written, never fsynced").unwrap();
    std::os::unix::fs::symlink("plain", d.mnt.join("sub/link")).unwrap();
    fs::write(d.mnt.join("sub/gone"), b"unlinked").unwrap();
    fs::remove_file(d.mnt.join("sub/gone")).unwrap();
    let mut names: Vec<_> = fs::read_dir(d.mnt.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["link", "plain"]);
    assert_eq!(fs::read_link(d.mnt.join("sub/link")).unwrap(), Path::new("plain"));

    let mapped = d.mnt.join("mapped");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&mapped)
        .unwrap();
    file.set_len(65536).unwrap();
    let code = in_child(|| {
        // SAFETY: nothing else maps or truncates the file meanwhile.
        let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
            return 2;
        };
        map[..5].copy_from_slice(b"mmap!");
        map[65531..].copy_from_slice(b"tail!");
        0
    });
    assert_eq!(code, 0, "child failed");
    drop(file);
    assert_eq!(fs::read(d.backing.join("sub/plain")).unwrap(), b"");

    lazy.unmount().unwrap();
    assert_eq!(
        fs::read(d.backing.join("sub/plain")).unwrap(),
        b"written, never fsynced"
    );
    let data = fs::read(d.backing.join("mapped")).unwrap();
    assert_eq!(
        (&data[..5], &data[65531..], data.len()),
        (&b"mmap!"[..], &b"tail!"[..], 65536)
    );
    assert!(!d.backing.join("sub/gone").exists());

    // A new mount serves the same bytes, and so does dropping it.
    let lazy = mount(&d);
    assert_eq!(fs::read(d.mnt.join("sub/plain")).unwrap(), b"written, never fsynced");
    fs::write(d.mnt.join("dropped"), b"flushed by drop").unwrap();
    drop(lazy);
    assert_eq!(fs::read(d.backing.join("dropped")).unwrap(), b"flushed by drop");
}

/// Timings of a raftmq-like segment: `cargo test ... lazyfs -- --ignored --nocapture`.
#[test]
#[ignore = "measurement, not a check"]
fn segment_throughput() {
    const LEN: usize = 64 << 20;
    let d = dirs();
    let t = Instant::now();
    let mut lazy = mount(&d);
    eprintln!("mount: {:?}", t.elapsed());
    let path = d.mnt.join("segment");
    let file = new_file(&path);
    let t = Instant::now();
    fallocate(&file, LEN as i64);
    eprintln!("posix_fallocate 64 MiB: {:?}", t.elapsed());
    let t = Instant::now();
    let code = in_child(|| {
        // SAFETY: nothing else maps or truncates the file meanwhile.
        let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
            return 2;
        };
        let record = [7u8; 4096];
        // 1 KiB records, an msync every 256 KiB.
        for off in (0..LEN).step_by(1024) {
            map[off..off + 1024].copy_from_slice(&record[..1024]);
            if (off + 1024) % (256 << 10) == 0 && map.flush_range(off + 1024 - (256 << 10), 256 << 10).is_err() {
                return 3;
            }
        }
        0
    });
    assert_eq!(code, 0);
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "64 MiB through the map, msync every 256 KiB: {secs:.2} s, {:.0} MiB/s",
        64.0 / secs
    );
    drop(file);
    let t = Instant::now();
    let report = lazy.lose_unsynced().unwrap();
    eprintln!("lose_unsynced (unmount + mount): {:?}, {report:?}", t.elapsed());
    let t = Instant::now();
    assert!(fs::read(&path).unwrap().iter().all(|&b| b == 7));
    eprintln!("read back 64 MiB: {:?}", t.elapsed());

    // The same through write(): 4 KiB appends, an fdatasync every 256 KiB.
    let mut log = File::create(d.mnt.join("log")).unwrap();
    let t = Instant::now();
    for i in 0..(LEN / 4096) {
        log.write_all(&[9u8; 4096]).unwrap();
        if (i + 1) % 64 == 0 {
            log.sync_data().unwrap();
        }
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "64 MiB of 4 KiB write()s, fdatasync every 256 KiB: {secs:.2} s, {:.0} MiB/s",
        64.0 / secs
    );
    // And 64 MiB never synced, then lost.
    log.write_all(&vec![1u8; LEN]).unwrap();
    drop(log);
    let t = Instant::now();
    let report = lazy.lose_unsynced().unwrap();
    eprintln!("lose_unsynced with 64 MiB pending: {:?}, {report:?}", t.elapsed());
    let t = Instant::now();
    lazy.unmount().unwrap();
    eprintln!("unmount: {:?}", t.elapsed());
}

#[test]
fn a_mount_names_its_fuse_connection_for_the_watchdog() {
    let d = dirs();
    let fs = mount(&d);
    let id = fuse_connection(&d.mnt).expect("the mount's FUSE connection in fusectl");
    assert!(Path::new(FUSE_CONNECTIONS).join(&id).join("abort").exists(), "{id}");
    // An unmount whose session ends at once never aborts it.
    let watchdog = Watchdog::start(&d.mnt);
    assert!(!watchdog.stop());
    fs.unmount().unwrap();
    assert!(
        !Path::new(FUSE_CONNECTIONS).join(&id).exists(),
        "the connection ended with the unmount"
    );
}

/// A copy of the mount in another process's mount namespace (each node
/// runs in one, with copies of every mount of the run) kept the session
/// alive after the unmount, stalling a power loss until that process
/// ended; the watchdog aborts the connection instead, and the mount works
/// again after.
#[test]
fn an_unmount_a_copy_elsewhere_holds_is_aborted_not_waited_for() {
    let d = dirs();
    let mut fs = mount(&d);
    let mut holder = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "unchanged", "sleep", "120"])
        .spawn()
        .expect("unshare (util-linux)");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = Instant::now();
    fs.lose_unsynced().unwrap();
    let took = started.elapsed();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(took < SESSION_PATIENCE * 2, "the power loss took {took:?}");
    fs::write(d.mnt.join("after"), b"x").unwrap();
    assert_eq!(fs::read(d.mnt.join("after")).unwrap(), b"x");
    fs.unmount().unwrap();
}
