//! Data integrity through a real mount over real servers: an fsx-style random exerciser checks
//! every read against an in-memory model while doing every operation fsx does (so a clone
//! without `../shared/tools/fs-suites` still covers them): writes and reads at random offsets
//! and sizes across stripe boundaries, truncates (by descriptor and by path), close and reopen,
//! fallocate (allocate, KEEP_SIZE, punch hole), mmap reads and shared mmap writes, O_DIRECT
//! reads and writes, copy_file_range, fsync and fdatasync. Replay a failure with
//! SURGE_TEST_SEED=<seed printed below>.

mod common;
use common::*;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

fn check_read(f: &File, model: &[u8], off: u64, len: usize, ctx: &str) {
    let mut buf = vec![0xAAu8; len];
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut buf[got..], off + got as u64).expect("pread");
        if n == 0 {
            break;
        }
        got += n;
    }
    let start = (off as usize).min(model.len());
    let end = (off as usize + len).min(model.len());
    assert_eq!(
        got,
        end - start,
        "{ctx}: short/long read at {off}+{len} (file {})",
        model.len()
    );
    if buf[..got] != model[start..end] {
        let first = buf[..got]
            .iter()
            .zip(&model[start..end])
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "{ctx}: data mismatch at file offset {}",
            off as usize + first
        );
    }
}

fn exercise(cluster_servers: usize, stripe: &str, ops: usize, max_file: u64) {
    let c = cluster(cluster_servers, "1GiB");
    let id = c.create_instance("1GiB", stripe, &[]);
    let m = Mount::new(&c, id, 0);
    let seed = seed();
    eprintln!("fsx: seed {seed} ({cluster_servers} fragments, stripe {stripe})");
    let mut rng = Rng(seed);
    let path = m.path("fsx.dat");
    let mut model: Vec<u8> = Vec::new();
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .expect("open")
    };
    let mut f = open();
    let mut history = Vec::new();
    for op in 0..ops {
        let kind = rng.below(20);
        history.push(kind);
        // The last operations' kinds (see the match below), for the failure message.
        let ctx = format!(
            "seed {seed} op {op} (kinds of the last ops: {:?})",
            &history[history.len().saturating_sub(10)..]
        );
        match kind {
            0..=4 => {
                let off = rng.below(max_file);
                let len = 1 + rng.below(300 * 1024) as usize;
                let mut data = vec![0u8; len];
                rng.fill(&mut data);
                f.write_all_at(&data, off)
                    .unwrap_or_else(|e| panic!("{ctx}: pwrite: {e}"));
                let end = off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            5..=7 => {
                let off = rng.below(max_file + 65536);
                let len = 1 + rng.below(400 * 1024) as usize;
                check_read(&f, &model, off, len, &ctx);
            }
            8 => {
                let size = rng.below(max_file);
                f.set_len(size)
                    .unwrap_or_else(|e| panic!("{ctx}: ftruncate: {e}"));
                model.resize(size as usize, 0);
            }
            9 => {
                // Close and reopen: what was written is there, with the right size.
                drop(f);
                f = open();
                let md = f.metadata().expect("fstat");
                assert_eq!(md.len(), model.len() as u64, "{ctx}: size after reopen");
            }
            10 => {
                let md = std::fs::metadata(&path).expect("stat");
                assert_eq!(md.len(), model.len() as u64, "{ctx}: stat size while open");
            }
            11 => {
                // Truncate by path on a second handle, then keep using the first.
                let size = rng.below(max_file);
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .expect("open2")
                    .set_len(size)
                    .expect("truncate");
                model.resize(size as usize, 0);
            }
            12..=14 => {
                // fallocate: allocate (extends), KEEP_SIZE (no change), punch hole (zeros).
                let off = rng.below(max_file);
                let len = 1 + rng.below(256 * 1024);
                let mode = match rng.below(3) {
                    0 => 0,
                    1 => libc::FALLOC_FL_KEEP_SIZE,
                    _ => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                };
                // SAFETY: fallocate on a descriptor owned by `f`.
                let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
                assert_eq!(
                    rc,
                    0,
                    "{ctx}: fallocate {mode:#x} {off}+{len}: {}",
                    std::io::Error::last_os_error()
                );
                let end = (off + len) as usize;
                if mode == 0 && end > model.len() {
                    model.resize(end, 0);
                } else if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
                    let from = (off as usize).min(model.len());
                    let to = end.min(model.len());
                    model[from..to].fill(0);
                }
            }
            15 | 16 if !model.is_empty() => {
                // mmap: a shared mapping of the whole file; read a range, or write one and
                // msync it.
                let len = model.len();
                let write = rng.below(2) == 1;
                let prot = libc::PROT_READ | if write { libc::PROT_WRITE } else { 0 };
                // SAFETY: a fresh shared mapping of `len` bytes of `f`, unmapped below.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        prot,
                        libc::MAP_SHARED,
                        f.as_raw_fd(),
                        0,
                    )
                };
                assert_ne!(
                    p,
                    libc::MAP_FAILED,
                    "{ctx}: mmap: {}",
                    std::io::Error::last_os_error()
                );
                // SAFETY: the mapping covers `len` bytes and lives until munmap.
                let map = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
                let off = rng.below(len as u64) as usize;
                let n = (1 + rng.below(128 * 1024) as usize).min(len - off);
                if write {
                    let mut data = vec![0u8; n];
                    rng.fill(&mut data);
                    map[off..off + n].copy_from_slice(&data);
                    model[off..off + n].copy_from_slice(&data);
                    // SAFETY: the mapping made above.
                    assert_eq!(
                        unsafe { libc::msync(p, len, libc::MS_SYNC) },
                        0,
                        "{ctx}: msync"
                    );
                } else {
                    assert!(
                        map[off..off + n] == model[off..off + n],
                        "{ctx}: mmap read at {off}+{n}"
                    );
                }
                // SAFETY: the mapping made above, not used after.
                unsafe { libc::munmap(p, len) };
            }
            17 => {
                // O_DIRECT on a second descriptor: 4 KiB aligned offsets, lengths, buffers.
                use std::os::unix::fs::OpenOptionsExt;
                let d = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .expect("open O_DIRECT");
                let off = rng.below(max_file / 4096) * 4096;
                let blocks = 1 + rng.below(32) as usize;
                let layout = std::alloc::Layout::from_size_align(blocks * 4096, 4096).unwrap();
                // SAFETY: a non-zero layout; freed below.
                let buf = unsafe { std::alloc::alloc_zeroed(layout) };
                assert!(!buf.is_null());
                // SAFETY: `buf` holds `blocks * 4096` bytes until dealloc.
                let b = unsafe { std::slice::from_raw_parts_mut(buf, blocks * 4096) };
                if rng.below(2) == 0 {
                    rng.fill(b);
                    d.write_all_at(b, off)
                        .unwrap_or_else(|e| panic!("{ctx}: O_DIRECT write: {e}"));
                    let end = off as usize + b.len();
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(b);
                } else {
                    let n = d
                        .read_at(b, off)
                        .unwrap_or_else(|e| panic!("{ctx}: O_DIRECT read: {e}"));
                    let want = model.len().saturating_sub(off as usize).min(b.len());
                    assert_eq!(n, want, "{ctx}: O_DIRECT read length at {off}");
                    if n > 0 {
                        let o = off as usize;
                        assert!(b[..n] == model[o..o + n], "{ctx}: O_DIRECT read at {off}");
                    }
                }
                // SAFETY: allocated above with this layout.
                unsafe { std::alloc::dealloc(buf, layout) };
            }
            18 if model.len() > 2 => {
                // copy_file_range within the file, source and destination not overlapping.
                let len = model.len() as u64;
                let src = rng.below(len / 2);
                let n = 1 + rng.below((len / 2 - src).clamp(1, 256 * 1024));
                let dst = len / 2 + rng.below(max_file.saturating_sub(len / 2).max(1));
                let (mut off_in, mut off_out) = (src as i64, dst as i64);
                // SAFETY: both offsets are ours; the same open file on both sides.
                let r = unsafe {
                    libc::copy_file_range(
                        f.as_raw_fd(),
                        &mut off_in,
                        f.as_raw_fd(),
                        &mut off_out,
                        n as usize,
                        0,
                    )
                };
                assert!(
                    r >= 0,
                    "{ctx}: copy_file_range: {}",
                    std::io::Error::last_os_error()
                );
                let r = r as usize;
                let data = model[src as usize..src as usize + r].to_vec();
                let end = dst as usize + r;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[dst as usize..end].copy_from_slice(&data);
            }
            _ => {
                if rng.below(2) == 0 {
                    f.sync_all().unwrap_or_else(|e| panic!("{ctx}: fsync: {e}"));
                } else {
                    f.sync_data()
                        .unwrap_or_else(|e| panic!("{ctx}: fdatasync: {e}"));
                }
            }
        }
    }
    drop(f);
    let mut all = Vec::new();
    File::open(&path)
        .expect("open")
        .read_to_end(&mut all)
        .expect("read all");
    assert!(
        all == model,
        "seed {seed}: final content differs (len {} vs {})",
        all.len(),
        model.len()
    );
}

#[test]
fn random_io_matches_model_on_three_fragments_with_small_stripes() {
    if skip_without_fuse("random_io_matches_model_on_three_fragments_with_small_stripes") {
        return;
    }
    // 64 KiB stripes over 3 fragments: most operations cross stripe and fragment boundaries.
    exercise(3, "64KiB", 1500, 3 << 20);
}

#[test]
fn random_io_matches_model_on_one_fragment() {
    if skip_without_fuse("random_io_matches_model_on_one_fragment") {
        return;
    }
    exercise(1, "8MiB", 600, 24 << 20);
}

#[test]
fn sparse_files_read_zeros_in_holes_and_allocate_only_written_stripes() {
    if skip_without_fuse("sparse_files_read_zeros_in_holes_and_allocate_only_written_stripes") {
        return;
    }
    let c = cluster(2, "1GiB");
    let id = c.create_instance("2GiB", "1MiB", &[]);
    let m = Mount::new(&c, id, 0);
    let p = m.path("sparse");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    // 1 GiB apparent size, 8 KiB of data at each end.
    f.write_all_at(&[1u8; 4096], 0).unwrap();
    f.write_all_at(&[2u8; 4096], (1 << 30) - 4096).unwrap();
    drop(f);
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(md.len(), 1 << 30);
    let f = File::open(&p).unwrap();
    let mut buf = vec![9u8; 1 << 20];
    f.read_exact_at(&mut buf, 512 << 20).unwrap();
    assert!(buf.iter().all(|b| *b == 0), "hole reads as zeros");
    let mut tail = vec![0u8; 4096];
    f.read_exact_at(&mut tail, (1 << 30) - 4096).unwrap();
    assert!(tail.iter().all(|b| *b == 2));
    // The fragments hold only what was written.
    let used: u64 = c.servers.iter().map(|s| walk_size(&s.device)).sum();
    assert!(
        used < 4 << 20,
        "servers store {used} bytes for 8 KiB of data"
    );
    let _ = md.blocks();
}

/// `lseek(2)` with `whence`; the errno on failure.
fn seek(f: &File, offset: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: lseek on a descriptor `f` owns.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset as libc::off_t, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r as u64)
    }
}

/// A 64 MiB file holding 4 KiB at 0, at 40 MiB and at its end, written into the mount at
/// `rel`, then checked the way copying tools look at it: `st_blocks` and `du` count only what
/// is stored, `SEEK_DATA`/`SEEK_HOLE` find the three pieces, and `tar -S` and
/// `cp --sparse=auto` make small copies that read back the same.
fn sparse_file_is_seen_sparse(m: &Mount, rel: &str) {
    const MIB: u64 = 1 << 20;
    let size = 64 * MIB;
    let p = m.path(rel);
    let f = File::create(&p).unwrap();
    f.write_all_at(&[1u8; 4096], 0).unwrap();
    f.write_all_at(&[2u8; 4096], 40 * MIB).unwrap();
    f.write_all_at(&[3u8; 4096], size - 4096).unwrap();
    drop(f);

    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(md.len(), size);
    assert!(
        md.blocks() * 512 < MIB,
        "{rel}: st_blocks says {} bytes allocated for 12 KiB of data",
        md.blocks() * 512
    );
    let du = std::process::Command::new("du")
        .arg("-k")
        .arg(&p)
        .output()
        .unwrap();
    let du_kib: u64 = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(du_kib < 1024, "{rel}: du says {du_kib} KiB");

    let f = File::open(&p).unwrap();
    assert_eq!(seek(&f, 0, libc::SEEK_DATA), Ok(0));
    let hole = seek(&f, 0, libc::SEEK_HOLE).unwrap();
    assert!((4096..MIB).contains(&hole), "{rel}: first hole at {hole}");
    let data = seek(&f, hole, libc::SEEK_DATA).unwrap();
    assert!(
        (40 * MIB - MIB..=40 * MIB).contains(&data),
        "{rel}: second piece found at {data}"
    );
    assert!(seek(&f, 40 * MIB + 4096, libc::SEEK_HOLE).unwrap() <= 41 * MIB);
    let last = seek(&f, 41 * MIB, libc::SEEK_DATA).unwrap();
    assert!(
        (size - MIB..=size - 4096).contains(&last),
        "{rel}: last piece at {last}"
    );
    assert_eq!(seek(&f, size - 1, libc::SEEK_HOLE), Ok(size));
    assert_eq!(seek(&f, size, libc::SEEK_DATA), Err(libc::ENXIO));
    drop(f);

    let out = Scratch::new("sparse-copies");
    let tar = out.path().join("s.tar");
    let st = std::process::Command::new("tar")
        .arg("-S")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&m.dir)
        .arg(rel)
        .status()
        .unwrap();
    assert!(st.success());
    let tar_len = std::fs::metadata(&tar).unwrap().len();
    assert!(tar_len < MIB, "{rel}: tar -S made {tar_len} bytes");
    let copy = out.path().join("copy");
    let st = std::process::Command::new("cp")
        .arg("--sparse=auto")
        .arg(&p)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    let cmd = std::fs::metadata(&copy).unwrap();
    assert_eq!(cmd.len(), size);
    assert!(
        cmd.blocks() * 512 < 4 * MIB,
        "{rel}: cp --sparse=auto allocated {} bytes",
        cmd.blocks() * 512
    );
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&p).unwrap());
    let back = out.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let st = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&back)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(std::fs::read(back.join(rel)).unwrap() == std::fs::read(&p).unwrap());
}

#[test]
fn sparse_files_report_their_allocation_and_holes_to_du_tar_and_cp() {
    if skip_without_fuse("sparse_files_report_their_allocation_and_holes_to_du_tar_and_cp") {
        return;
    }
    let c = cluster(2, "1GiB");
    let id = c.create_instance("2GiB", "1MiB", &[]);
    // Striped over both fragments, through the servers.
    let striped = Mount::with_args(&c, id, 0, &["--layout", "stripe_count=all"]);
    sparse_file_is_seen_sparse(&striped, "striped");
    drop(striped);
    // The mount's default: one stripe on a fragment of this host, by passthrough where the
    // kernel allows it.
    let local = Mount::new(&c, id, 0);
    sparse_file_is_seen_sparse(&local, "local");
}

fn walk_size(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let md = match e.metadata() {
                Ok(m) => m,
                Err(_) => continue,
            };
            if md.is_dir() {
                total += walk_size(&e.path());
            } else if e.file_name().to_string_lossy().contains('-')
                && !e.file_name().to_string_lossy().ends_with(".json")
            {
                total += md.blocks() * 512;
            }
        }
    }
    total
}
