//! `strace -f -T -tt` logs (also -ttt, -y, -o file or stderr, `[pid N]` or `N ` prefixes,
//! split `<unfinished ...>` / `<... resumed>` lines). This is Daley's own instrument (§3.3): it
//! sees kernel calls, so stdio buffering is already resolved, and each call's time (-T).
//!
//! What it tracks: per process (thread group) an fd table fed by open/dup/close/clone/execve,
//! and per path the same counters as the shim. Relative paths are resolved against chdir()
//! calls seen in the log, else left relative (strace does not print the starting directory).

use crate::model::{
    Counters, Ending, FileKind, FileStats, Process, Profile, Source, SourceKind, Timeline,
    SMALL_IO_BYTES,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

#[derive(Debug, thiserror::Error)]
pub enum StraceError {
    #[error("{file} holds no strace lines (expected `strace -f -T -tt -o FILE CMD` output)")]
    Empty { file: String },
}

#[derive(Clone, Debug)]
struct Fd {
    path: String,
    offset: u64,
    cloexec: bool,
}

type FdTable = Rc<RefCell<HashMap<i64, Fd>>>;

#[derive(Default)]
struct Proc {
    tgid: i64,
    ppid: i64,
    exe: String,
    cmdline: String,
    start: f64,
    end: f64,
    ending: Ending,
    threads: u32,
    io_tids: std::collections::BTreeSet<i64>,
    cwd: String,
}

#[derive(Default)]
struct State {
    fds: HashMap<i64, FdTable>,
    tgid: HashMap<i64, i64>,
    procs: BTreeMap<i64, Proc>,
    files: HashMap<(i64, String), (FileKind, Counters)>,
    pending: HashMap<i64, (f64, String)>,
    t_first: Option<f64>,
    t_last: f64,
    last_clock: f64,
    day_offset: f64,
    events: Vec<(f64, u64, u64, u64, u64)>,
    lines: usize,
}

/// Splits a call's argument text at top-level commas (outside quotes and brackets).
fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    let mut in_str = false;
    let mut esc = false;
    for ch in s.chars() {
        if in_str {
            cur.push(ch);
            if esc {
                esc = false;
            } else if ch == '\\' {
                esc = true;
            } else if ch == '"' {
                in_str = false;
            }
            continue;
        }
        match ch {
            '"' => {
                in_str = true;
                cur.push(ch);
            }
            '(' | '[' | '{' => {
                depth += 1;
                cur.push(ch);
            }
            ')' | ']' | '}' => {
                depth -= 1;
                cur.push(ch);
            }
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
            }
            _ => cur.push(ch),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Decodes a strace string literal ("..." with C escapes); None if it is not one.
fn unquote(s: &str) -> Option<String> {
    let s = s.trim();
    let inner = s.strip_prefix('"')?;
    let inner = inner.strip_suffix("...").unwrap_or(inner);
    let inner = inner.strip_suffix('"')?;
    let mut out = Vec::new();
    let b = inner.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            i += 1;
            match b[i] {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'"' => out.push(b'"'),
                b'\\' => out.push(b'\\'),
                b'x' if i + 2 < b.len() => {
                    let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                    out.push(u8::from_str_radix(h, 16).ok()?);
                    i += 2;
                }
                c if c.is_ascii_digit() => {
                    let mut v = 0u32;
                    let mut n = 0;
                    while n < 3 && i < b.len() && b[i].is_ascii_digit() {
                        v = v * 8 + u32::from(b[i] - b'0');
                        i += 1;
                        n += 1;
                    }
                    out.push(v as u8);
                    continue;
                }
                c => out.push(c),
            }
        } else {
            out.push(b[i]);
        }
        i += 1;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// An fd argument, possibly decorated by -y: `3` or `3</path>`. Returns (fd, path).
fn fd_arg(s: &str) -> Option<(i64, Option<String>)> {
    let s = s.trim();
    if let Some((n, rest)) = s.split_once('<') {
        let fd = n.trim().parse().ok()?;
        let p = rest.strip_suffix('>').unwrap_or(rest).to_string();
        return Some((fd, Some(p)));
    }
    if s == "AT_FDCWD" {
        return Some((libc::AT_FDCWD as i64, None));
    }
    s.parse().ok().map(|fd| (fd, None))
}

/// Parses the "HH:MM:SS.ffffff" (-tt), "HH:MM:SS" (-t) or "1700000000.123" (-ttt) stamp.
fn parse_clock(s: &str) -> Option<f64> {
    if s.contains(':') {
        let mut parts = s.split(':');
        let h: f64 = parts.next()?.parse().ok()?;
        let m: f64 = parts.next()?.parse().ok()?;
        let sec: f64 = parts.next()?.parse().ok()?;
        Some(h * 3600.0 + m * 60.0 + sec)
    } else {
        s.parse().ok()
    }
}

fn kind_from_mode(text: &str) -> Option<FileKind> {
    let m = text.split("mode=").nth(1)?;
    Some(if m.starts_with("S_IFREG") {
        FileKind::Regular
    } else if m.starts_with("S_IFDIR") {
        FileKind::Directory
    } else if m.starts_with("S_IFCHR") {
        FileKind::CharDevice
    } else if m.starts_with("S_IFIFO") {
        FileKind::Fifo
    } else if m.starts_with("S_IFSOCK") {
        FileKind::Socket
    } else if m.starts_with("S_IFLNK") {
        FileKind::Symlink
    } else if m.starts_with("S_IFBLK") {
        FileKind::BlockDevice
    } else {
        FileKind::Unknown
    })
}

fn size_from_stat(text: &str) -> Option<u64> {
    let after = text
        .split("st_size=")
        .nth(1)
        .or_else(|| text.split("stx_size=").nth(1))?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn normalize(path: &str) -> String {
    let abs = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let j = parts.join("/");
    if abs {
        format!("/{j}")
    } else {
        j
    }
}

impl State {
    fn tgid_of(&self, pid: i64) -> i64 {
        self.tgid.get(&pid).copied().unwrap_or(pid)
    }

    fn table(&mut self, pid: i64) -> FdTable {
        let tg = self.tgid_of(pid);
        self.fds.entry(tg).or_default().clone()
    }

    fn proc_mut(&mut self, pid: i64, t: f64) -> &mut Proc {
        let tg = self.tgid_of(pid);
        let p = self.procs.entry(tg).or_insert_with(|| Proc {
            tgid: tg,
            start: t,
            threads: 1,
            ..Proc::default()
        });
        p.end = p.end.max(t);
        p
    }

    fn resolve(&mut self, pid: i64, dirfd: Option<(i64, Option<String>)>, path: &str) -> String {
        if path.starts_with('/') {
            return normalize(path);
        }
        let base = match dirfd {
            Some((fd, Some(p))) if fd != libc::AT_FDCWD as i64 => p,
            Some((fd, None)) if fd != libc::AT_FDCWD as i64 => self
                .table(pid)
                .borrow()
                .get(&fd)
                .map(|f| f.path.clone())
                .unwrap_or_default(),
            _ => {
                let tg = self.tgid_of(pid);
                self.procs
                    .get(&tg)
                    .map(|p| p.cwd.clone())
                    .unwrap_or_default()
            }
        };
        if base.is_empty() {
            normalize(path)
        } else {
            normalize(&format!("{base}/{path}"))
        }
    }

    fn fd_path(&mut self, pid: i64, arg: &str) -> (i64, String) {
        let Some((fd, deco)) = fd_arg(arg) else {
            return (-1, "<fd ?>".into());
        };
        if let Some(p) = deco {
            let p = if p.starts_with('/') { normalize(&p) } else { p };
            return (fd, p);
        }
        let known = self.table(pid).borrow().get(&fd).map(|f| f.path.clone());
        let name = match (known, fd) {
            (Some(p), _) => p,
            (None, 0) => "<STDIN>".into(),
            (None, 1) => "<STDOUT>".into(),
            (None, 2) => "<STDERR>".into(),
            (None, n) => format!("<fd {n}>"),
        };
        (fd, name)
    }

    fn counters(&mut self, pid: i64, path: &str, kind: FileKind) -> &mut Counters {
        let tg = self.tgid_of(pid);
        let e = self
            .files
            .entry((tg, path.to_string()))
            .or_insert((FileKind::Unknown, Counters::default()));
        if kind != FileKind::Unknown && matches!(e.0, FileKind::Unknown | FileKind::Missing) {
            e.0 = kind;
        }
        &mut e.1
    }
}

fn touch(c: &mut Counters, t0: u64, t1: u64) {
    if c.first_ns == 0 || t0 < c.first_ns {
        c.first_ns = t0.max(1);
    }
    c.last_ns = c.last_ns.max(t1);
}

fn hist_bucket(n: u64) -> usize {
    crate::model::HIST_EDGES
        .iter()
        .position(|&e| n <= e)
        .unwrap_or(9)
}

/// Parses an strace log.
pub fn parse(text: &str, stage: &str, file: &str) -> Result<Profile, StraceError> {
    // `strace -f` prints a line when the call finishes, so a new thread's first calls can come
    // before the `clone` that made it returns: learn the thread groups in a first pass, so
    // those calls are counted for the right process.
    let mut pre = State::default();
    for raw in text.lines() {
        parse_line(&mut pre, raw);
    }
    let mut st = State {
        tgid: pre.tgid,
        ..State::default()
    };
    for raw in text.lines() {
        parse_line(&mut st, raw);
    }
    if st.lines == 0 {
        return Err(StraceError::Empty {
            file: file.to_string(),
        });
    }
    let t0 = st.t_first.unwrap_or(0.0);
    let source = Source {
        kind: SourceKind::Strace,
        command: Vec::new(),
        file: Some(file.to_string()),
        exit_code: None,
        signal: None,
        detail: "strace -f -T -tt".into(),
    };
    let mut p = Profile::new(stage, source);
    p.wall_time_s = (st.t_last - t0).max(0.0);
    if let Some(first) = st.procs.values().next() {
        p.source.command = first
            .cmdline
            .split_whitespace()
            .map(str::to_string)
            .collect();
    }
    let shift = |ns: u64| -> u64 {
        if ns == 0 {
            0
        } else {
            ns.saturating_sub((t0 * 1e9) as u64).max(1)
        }
    };
    let mut merged: BTreeMap<String, FileStats> = BTreeMap::new();
    for ((_tg, path), (kind, c)) in st.files {
        let mut c = c;
        c.first_ns = shift(c.first_ns);
        c.last_ns = shift(c.last_ns);
        c.first_read_ns = shift(c.first_read_ns);
        c.first_write_ns = shift(c.first_write_ns);
        let e = merged.entry(path.clone()).or_insert_with(|| FileStats {
            path: path.clone(),
            exists_after: None,
            kind,
            processes: 0,
            counters: Counters::default(),
        });
        e.counters.merge(&c);
        e.processes += 1;
        if matches!(e.kind, FileKind::Unknown | FileKind::Missing) && kind != FileKind::Unknown {
            e.kind = kind;
        }
    }
    p.files = merged.into_values().collect();
    p.processes = st
        .procs
        .values()
        .map(|pr| Process {
            pid: pr.tgid,
            ppid: pr.ppid,
            exe: pr.exe.clone(),
            cmdline: pr.cmdline.clone(),
            start_s: pr.start - t0,
            end_s: pr.end - t0,
            ending: pr.ending,
            threads: pr.threads,
            io_threads: pr.io_tids.len() as u32,
            peak_rss_bytes: 0,
        })
        .collect();
    // Timeline: 10 ms bins, doubled until the run fits in 512.
    let mut bin = 0.01;
    while p.wall_time_s / bin >= 512.0 {
        bin *= 2.0;
    }
    let n = (p.wall_time_s / bin) as usize + 1;
    let mut tl = Timeline {
        bin_s: bin,
        bytes_read: vec![0; n],
        bytes_written: vec![0; n],
        data_ops: vec![0; n],
        meta_ops: vec![0; n],
    };
    for (t, r, w, d, m) in st.events {
        let i = (((t - t0) / bin).max(0.0) as usize).min(n - 1);
        tl.bytes_read[i] += r;
        tl.bytes_written[i] += w;
        tl.data_ops[i] += d;
        tl.meta_ops[i] += m;
    }
    p.timeline = tl;
    p.caveats.push(
        "strace records no peak memory and adds its own overhead to every call's time (Daley §3.4 \
         used it for counts and IPM for times)"
            .into(),
    );
    Ok(p)
}

fn parse_line(st: &mut State, raw: &str) {
    let mut line = raw.trim_end();
    // Prefix: "[pid  123] " (stderr) or "123 " (-o with -f); absent for a single process.
    let mut pid = 0i64;
    if let Some(rest) = line.strip_prefix("[pid") {
        if let Some((n, rest)) = rest.split_once(']') {
            pid = n.trim().parse().unwrap_or(0);
            line = rest.trim_start();
        }
    } else if let Some((n, rest)) = line.split_once(' ') {
        if let Ok(v) = n.parse::<i64>() {
            pid = v;
            line = rest.trim_start();
        }
    }
    // Timestamp.
    let (clock, rest) = match line.split_once(' ') {
        Some((c, rest)) if c.chars().next().is_some_and(|ch| ch.is_ascii_digit()) => {
            match parse_clock(c) {
                Some(t) => (Some(t), rest),
                None => (None, line),
            }
        }
        _ => (None, line),
    };
    let mut t = match clock {
        Some(c) => {
            // -tt has no date: a clock that jumps back by hours crossed midnight.
            if c + st.day_offset < st.last_clock - 43_200.0 {
                st.day_offset += 86_400.0;
            }
            c + st.day_offset
        }
        None => st.last_clock,
    };
    if clock.is_some() {
        st.last_clock = t;
    }
    let body = rest.trim();
    if body.starts_with("+++") {
        st.lines += 1;
        let ending = if body.contains("exited with") {
            Ending::Exit
        } else {
            Ending::Unknown
        };
        let p = st.proc_mut(pid, t);
        if pid == p.tgid {
            p.ending = ending;
        }
        st.t_last = st.t_last.max(t);
        return;
    }
    if body.starts_with("---") {
        return; // signal delivery
    }
    let full = if let Some(head) = body.strip_suffix("<unfinished ...>") {
        st.pending.insert(pid, (t, head.to_string()));
        return;
    } else if let Some(rest) = body.strip_prefix("<... ") {
        let Some((_, tail)) = rest.split_once(" resumed>") else {
            return;
        };
        match st.pending.remove(&pid) {
            Some((t_start, head)) => {
                t = t_start;
                format!("{head}{tail}")
            }
            None => return,
        }
    } else {
        body.to_string()
    };
    let Some(open_paren) = full.find('(') else {
        return;
    };
    let name = full[..open_paren].trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return;
    }
    // The return value follows the last ")", padding spaces and "= " (strace aligns it).
    let Some((args_end, ret_start)) = full.rmatch_indices("= ").find_map(|(pos, _)| {
        let pre = full[..pos].trim_end();
        (pre.ends_with(')') && pre.len() > open_paren).then(|| (pre.len() - 1, pos + 2))
    }) else {
        return;
    };
    let args_text = &full[open_paren + 1..args_end];
    let ret_text = full[ret_start..].trim();
    let dur = ret_text
        .rfind('<')
        .and_then(|i| ret_text[i + 1..].strip_suffix('>'))
        .and_then(|d| d.parse::<f64>().ok())
        .unwrap_or(0.0);
    let ret_word = ret_text.split_whitespace().next().unwrap_or("");
    let (ret_num, ret_deco) = match fd_arg(ret_word) {
        Some((n, d)) => (n, d),
        None => (
            i64::from_str_radix(ret_word.trim_start_matches("0x"), 16)
                .ok()
                .filter(|_| ret_word.starts_with("0x"))
                .unwrap_or(-1),
            None,
        ),
    };
    let failed = ret_num < 0 || ret_word == "?";
    let enoent = ret_text.contains("ENOENT");
    st.lines += 1;
    if st.t_first.is_none() {
        st.t_first = Some(t);
    }
    st.t_last = st.t_last.max(t + dur);
    let args = split_args(args_text);
    let t0 = (t * 1e9) as u64;
    let t1 = ((t + dur) * 1e9) as u64;
    let dns = (dur * 1e9) as u64;
    st.proc_mut(pid, t + dur);
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");

    enum Ev {
        Meta,
        Data(bool, u64),
        None,
    }
    let mut ev = Ev::None;
    let meta_kind = |ok: bool| {
        if ok {
            FileKind::Unknown
        } else if enoent {
            FileKind::Missing
        } else {
            FileKind::Unknown
        }
    };
    let meta_on = |st: &mut State, path: &str, kind: FileKind, f: fn(&mut Counters)| {
        let c = st.counters(pid, path, kind);
        f(c);
        if failed {
            c.meta_errors += 1;
        }
        c.meta_time_ns += dns;
        touch(c, t0, t1);
    };
    match name {
        "open" | "openat" | "openat2" | "creat" => {
            let (dirfd, path_arg, flags) = if name == "open" || name == "creat" {
                (None, arg(0), arg(1))
            } else {
                (fd_arg(arg(0)), arg(1), arg(2))
            };
            let Some(path) = unquote(path_arg) else {
                return;
            };
            let abs = match &ret_deco {
                Some(p) if p.starts_with('/') => normalize(p),
                _ => st.resolve(pid, dirfd, &path),
            };
            let kind = if flags.contains("O_DIRECTORY") && !failed {
                FileKind::Directory
            } else if failed {
                meta_kind(false)
            } else {
                FileKind::Regular
            };
            meta_on(st, &abs, kind, |c| c.opens += 1);
            if !failed {
                st.table(pid).borrow_mut().insert(
                    ret_num,
                    Fd {
                        path: abs,
                        offset: 0,
                        cloexec: flags.contains("O_CLOEXEC"),
                    },
                );
            }
            ev = Ev::Meta;
        }
        "close" => {
            let (fd, path) = st.fd_path(pid, arg(0));
            meta_on(st, &path, FileKind::Unknown, |c| c.closes += 1);
            st.table(pid).borrow_mut().remove(&fd);
            ev = Ev::Meta;
        }
        "dup" | "dup2" | "dup3" | "fcntl" => {
            if name == "fcntl" && !arg(1).starts_with("F_DUPFD") {
                return;
            }
            if !failed {
                let (fd, _) = st.fd_path(pid, arg(0));
                let tbl = st.table(pid);
                let copy = tbl.borrow().get(&fd).cloned();
                if let Some(mut f) = copy {
                    f.cloexec = name == "dup3" && arg(2).contains("O_CLOEXEC");
                    tbl.borrow_mut().insert(ret_num, f);
                }
            }
            return;
        }
        "read" | "readv" | "pread64" | "preadv" | "preadv2" | "write" | "writev" | "pwrite64"
        | "pwritev" | "pwritev2" => {
            let is_write = name.starts_with('w') || name.starts_with("pw");
            let (fd, path) = st.fd_path(pid, arg(0));
            let bytes = if failed { 0 } else { ret_num as u64 };
            let positional = name.starts_with('p');
            let tbl = st.table(pid);
            let end = {
                let mut b = tbl.borrow_mut();
                match b.get_mut(&fd) {
                    Some(f) if !positional => {
                        f.offset += bytes;
                        f.offset
                    }
                    _ => {
                        let off: u64 = args.last().and_then(|a| a.parse().ok()).unwrap_or(0);
                        off + bytes
                    }
                }
            };
            let c = st.counters(pid, &path, FileKind::Unknown);
            if is_write {
                c.writes += 1;
                c.bytes_written += bytes;
                c.write_time_ns += dns;
                c.hist_write[hist_bucket(bytes)] += 1;
                if bytes > 0 {
                    c.max_byte_written = c.max_byte_written.max(end);
                }
                if c.first_write_ns == 0 && bytes > 0 {
                    c.first_write_ns = t0.max(1);
                }
            } else {
                c.reads += 1;
                c.bytes_read += bytes;
                c.read_time_ns += dns;
                c.hist_read[hist_bucket(bytes)] += 1;
                if bytes > 0 {
                    c.max_byte_read = c.max_byte_read.max(end);
                }
                if c.first_read_ns == 0 && bytes > 0 {
                    c.first_read_ns = t0.max(1);
                }
            }
            if bytes <= SMALL_IO_BYTES {
                c.small_data_time_ns += dns;
            } else {
                c.large_data_time_ns += dns;
            }
            touch(c, t0, t1);
            ev = Ev::Data(is_write, bytes);
        }
        "lseek" | "_llseek" => {
            let (fd, path) = st.fd_path(pid, arg(0));
            if !failed {
                if let Some(f) = st.table(pid).borrow_mut().get_mut(&fd) {
                    f.offset = ret_num as u64;
                }
            }
            let c = st.counters(pid, &path, FileKind::Unknown);
            c.seeks += 1;
            touch(c, t0, t1);
        }
        "fsync" | "fdatasync" => {
            let (_, path) = st.fd_path(pid, arg(0));
            let c = st.counters(pid, &path, FileKind::Unknown);
            c.syncs += 1;
            c.sync_time_ns += dns;
            c.small_data_time_ns += dns;
            touch(c, t0, t1);
            ev = Ev::Data(true, 0);
        }
        "fstat" | "fstat64" => {
            let (_, path) = st.fd_path(pid, arg(0));
            let kind = kind_from_mode(arg(1)).unwrap_or(FileKind::Unknown);
            let size = size_from_stat(arg(1));
            meta_on(st, &path, kind, |c| c.stats += 1);
            if let (Some(s), FileKind::Regular) = (size, kind) {
                let c = st.counters(pid, &path, kind);
                c.size_seen = c.size_seen.max(s);
            }
            ev = Ev::Meta;
        }
        "stat" | "lstat" | "stat64" | "lstat64" | "newfstatat" | "fstatat64" | "statx" => {
            let (dirfd, path_arg, buf) = if name.contains("at") || name == "statx" {
                (
                    fd_arg(arg(0)),
                    arg(1),
                    if name == "statx" { arg(4) } else { arg(2) },
                )
            } else {
                (None, arg(0), arg(1))
            };
            let Some(rel) = unquote(path_arg) else {
                return;
            };
            let path = if rel.is_empty() {
                // AT_EMPTY_PATH: a stat of the fd itself.
                st.fd_path(pid, arg(0)).1
            } else {
                st.resolve(pid, dirfd, &rel)
            };
            let kind = if failed {
                meta_kind(false)
            } else {
                kind_from_mode(buf).unwrap_or(FileKind::Unknown)
            };
            meta_on(st, &path, kind, |c| c.stats += 1);
            if let (Some(s), FileKind::Regular, false) = (size_from_stat(buf), kind, failed) {
                let c = st.counters(pid, &path, kind);
                c.size_seen = c.size_seen.max(s);
            }
            ev = Ev::Meta;
        }
        "access" | "faccessat" | "faccessat2" | "unlink" | "unlinkat" | "rmdir" | "mkdir"
        | "mkdirat" | "rename" | "renameat" | "renameat2" | "chdir" => {
            let at = name.ends_with("at") || name.ends_with("at2");
            let (dirfd, path_arg) = if at {
                (fd_arg(arg(0)), arg(1))
            } else {
                (None, arg(0))
            };
            let Some(rel) = unquote(path_arg) else {
                return;
            };
            let path = st.resolve(pid, dirfd, &rel);
            if name == "chdir" {
                if !failed {
                    let tg = st.tgid_of(pid);
                    if let Some(p) = st.procs.get_mut(&tg) {
                        p.cwd = path;
                    }
                }
                return;
            }
            let removedir =
                name == "rmdir" || (name == "unlinkat" && arg(2).contains("AT_REMOVEDIR"));
            let f: fn(&mut Counters) = match name {
                "access" | "faccessat" | "faccessat2" => |c| c.accesses += 1,
                "mkdir" | "mkdirat" => |c| c.mkdirs += 1,
                "rename" | "renameat" | "renameat2" => |c| c.renames += 1,
                _ if removedir => |c| c.rmdirs += 1,
                _ => |c| c.unlinks += 1,
            };
            meta_on(st, &path, meta_kind(!failed), f);
            ev = Ev::Meta;
        }
        "getdents" | "getdents64" => {
            let (_, path) = st.fd_path(pid, arg(0));
            meta_on(st, &path, FileKind::Directory, |c| c.readdirs += 1);
            ev = Ev::Meta;
        }
        "clone" | "clone3" | "fork" | "vfork" => {
            if failed || ret_num <= 0 {
                return;
            }
            let flags = args_text;
            let child = ret_num;
            let parent_tg = st.tgid_of(pid);
            if flags.contains("CLONE_THREAD") {
                st.tgid.insert(child, parent_tg);
                if let Some(p) = st.procs.get_mut(&parent_tg) {
                    p.threads += 1;
                }
            } else {
                let table = st.table(pid);
                let new_table: FdTable = if flags.contains("CLONE_FILES") {
                    table
                } else {
                    Rc::new(RefCell::new(table.borrow().clone()))
                };
                st.fds.insert(child, new_table);
                let (exe, cwd) = st
                    .procs
                    .get(&parent_tg)
                    .map(|p| (p.exe.clone(), p.cwd.clone()))
                    .unwrap_or_default();
                let cp = st.proc_mut(child, t + dur);
                cp.ppid = parent_tg;
                cp.exe = exe;
                cp.cwd = cwd;
            }
            return;
        }
        "execve" | "execveat" => {
            if failed {
                return;
            }
            let exe = unquote(arg(0)).unwrap_or_default();
            let argv: Vec<String> = arg(1)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(", ")
                .filter_map(unquote)
                .collect();
            let tbl = st.table(pid);
            tbl.borrow_mut().retain(|_, f| !f.cloexec);
            let p = st.proc_mut(pid, t);
            p.exe = exe;
            p.cmdline = argv.join(" ");
            return;
        }
        _ => return,
    }
    let tg = st.tgid_of(pid);
    if let Some(p) = st.procs.get_mut(&tg) {
        p.io_tids.insert(pid);
    }
    match ev {
        Ev::Meta => st.events.push((t, 0, 0, 0, 1)),
        Ev::Data(w, b) => st
            .events
            .push((t, if w { 0 } else { b }, if w { b } else { 0 }, 1, 0)),
        Ev::None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"100 10:00:00.000000 execve("/usr/bin/prog", ["prog", "x"], 0x7ffd /* 5 vars */) = 0 <0.000200>
100 10:00:00.001000 openat(AT_FDCWD, "/d/in.dat", O_RDONLY|O_CLOEXEC) = 3 <0.000010>
100 10:00:00.002000 read(3, "abc"..., 1048576) = 1048576 <0.001000>
100 10:00:00.003000 read(3, "", 1048576) = 0 <0.000005>
100 10:00:00.004000 newfstatat(AT_FDCWD, "/d/missing.py", 0x7ffe, 0) = -1 ENOENT (No such file or directory) <0.000004>
100 10:00:00.005000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f) = 101 <0.000100>
101 10:00:00.006000 write(3, "hello", 5 <unfinished ...>
100 10:00:00.006500 close(3) = 0 <0.000003>
101 10:00:00.007000 <... write resumed>) = 5 <0.000050>
101 10:00:00.008000 +++ exited with 0 +++
100 10:00:00.009000 +++ exited with 0 +++
"#;

    /// As `strace -f` may print it: the new thread's first call finishes before its `clone`.
    const THREAD_FIRST: &str = r#"200 10:00:00.000000 execve("/usr/bin/prog", ["prog"], 0x7ffd /* 5 vars */) = 0 <0.000200>
200 10:00:00.001000 openat(AT_FDCWD, "/d/out.dat", O_WRONLY|O_CREAT, 0644) = 3 <0.000010>
200 10:00:00.002000 clone(child_stack=0x7f, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM|CLONE_SETTLS|CLONE_PARENT_SETTID|CLONE_CHILD_CLEARTID, parent_tid=[201], tls=0x7f, child_tidptr=0x7f <unfinished ...>
201 10:00:00.003000 write(3, "hello", 5) = 5 <0.000020>
200 10:00:00.004000 <... clone resumed>) = 201 <0.000100>
201 10:00:00.005000 +++ exited with 0 +++
200 10:00:00.006000 close(3) = 0 <0.000003>
200 10:00:00.007000 +++ exited with 0 +++
"#;

    #[test]
    fn a_thread_seen_before_its_clone_returns_belongs_to_its_process() {
        let p = parse(THREAD_FIRST, "s", "log").unwrap();
        assert_eq!(p.processes.len(), 1, "{:?}", p.processes);
        assert_eq!((p.processes[0].threads, p.processes[0].io_threads), (2, 2));
        let f = p.files.iter().find(|f| f.path == "/d/out.dat").unwrap();
        assert_eq!((f.counters.writes, f.counters.bytes_written), (1, 5));
    }

    #[test]
    fn counts_calls_per_file_across_fork_and_split_lines() {
        let p = parse(LOG, "s", "log").unwrap();
        assert_eq!(p.processes.len(), 2);
        let f = p.files.iter().find(|f| f.path == "/d/in.dat").unwrap();
        assert_eq!(
            (f.counters.opens, f.counters.reads, f.counters.closes),
            (1, 2, 1)
        );
        assert_eq!(f.counters.bytes_read, 1048576);
        // The child inherited fd 3 through the fork.
        assert_eq!((f.counters.writes, f.counters.bytes_written), (1, 5));
        assert_eq!(f.processes, 2);
        assert_eq!(f.counters.large_data_time_ns, 1_000_000);
        let m = p.files.iter().find(|f| f.path == "/d/missing.py").unwrap();
        assert_eq!(
            (m.kind, m.counters.stats, m.counters.meta_errors),
            (FileKind::Missing, 1, 1)
        );
        assert!((p.wall_time_s - 0.009).abs() < 1e-6, "{}", p.wall_time_s);
        assert_eq!(p.source.command, vec!["prog", "x"]);
    }

    #[test]
    fn splits_arguments_outside_quotes_and_brackets() {
        let a = split_args(r#"3, "a, \"b\"", [1, 2], {st_mode=S_IFREG, st_size=5}"#);
        assert_eq!(a.len(), 4);
        assert_eq!(unquote(&a[1]).unwrap(), "a, \"b\"");
        assert_eq!(size_from_stat(&a[3]), Some(5));
    }
}
