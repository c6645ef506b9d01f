//! Data integrity through a real mount over real servers: an fsx-style random exerciser checks
//! every read against an in-memory model while writing at random offsets and sizes across
//! stripe boundaries, truncating, extending and reopening. Replay a failure with
//! SURGE_TEST_SEED=<seed printed below>.

mod common;
use common::*;
use std::fs::{File, OpenOptions};
use std::io::Read;
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
    for op in 0..ops {
        let ctx = format!("seed {seed} op {op}");
        match rng.below(12) {
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
            _ => {
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
