//! The I/O kernel language: a small, line-oriented text format that describes applications
//! (process count, placement, files) and the program every process runs (compute phases,
//! write/read phases, barriers, commits, loops). `docs/SIM.md` is the reference; in short:
//!
//! ```text
//! param procs = 2048                 # default, overridden by --param procs=...
//! app ior {
//!     processes $procs
//!     file out shared                # one file for all processes (or per_process)
//!     repeat 4 {
//!         write out 4MiB             # each process writes 4 MiB as one request
//!     }
//!     barrier
//! }
//! ```
//!
//! Parsing turns the text into [`AppSpec`]s whose program is a flat list of [`Op`]s with loop
//! markers, ready for the interpreter in the model. Every error names the file and line.

use crate::engine::SimTime;
use crate::units::parse_duration;
use std::collections::BTreeMap;
use std::fmt;

/// Deepest nesting of `repeat` blocks (each process keeps its loop counters inline).
pub const MAX_REPEAT_DEPTH: usize = 8;

/// One error in a kernel file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelError {
    pub origin: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.origin, self.line, self.message)
    }
}

/// All errors found in a kernel file (parsing continues after an error to report more).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelErrors(pub Vec<KernelError>);

impl fmt::Display for KernelErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for KernelErrors {}

/// A file an application uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSpec {
    pub name: String,
    /// `shared`: one file written by all processes (N-1); otherwise one file per process (N-N).
    pub shared: bool,
}

/// One instruction of a process's program.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Compute (no I/O) for `ns`, stretched by a uniform random factor in [1, 1 + jitter].
    Compute { ns: SimTime, jitter: f64 },
    /// Write `size` bytes per process in requests of `request` bytes, one after the other.
    /// `strided`: requests of all ranks interleave in a shared file (IOR `-s`); otherwise each
    /// rank's block is contiguous.
    Write {
        file: u16,
        size: u64,
        request: u64,
        strided: bool,
    },
    /// Read, with the same layout rules as `Write`; reads start at the beginning of the file
    /// and advance, so a read after writes reads the data back in the order it was written.
    Read {
        file: u16,
        size: u64,
        request: u64,
        strided: bool,
    },
    /// Wait for every process of the application.
    Barrier,
    /// Wait until the data this process has in the burst buffer (of one file, or all) is on
    /// the file servers; with a lazy drain this also starts the drain.
    Commit { file: Option<u16> },
    /// Start of `repeat count { ... }`; `end` is the index of the matching `EndRepeat`.
    Repeat { count: u32, end: u32 },
    /// End of a repeat block; `start` is the index of its `Repeat`.
    EndRepeat { start: u32 },
}

/// One application: who runs, where, and the program.
#[derive(Clone, Debug, PartialEq)]
pub struct AppSpec {
    pub name: String,
    /// `file:line` of the `app` statement.
    pub origin: String,
    pub processes: u32,
    /// Processes per node; `None`: the system's `compute.processes_per_node`.
    pub per_node: Option<u32>,
    /// Placement: first compute node; `None`: the next free I/O-node boundary.
    pub first_node: Option<u32>,
    /// Node count given instead of a process count (`nodes N`): processes = N x per_node.
    pub nodes: Option<u32>,
    pub files: Vec<FileSpec>,
    pub ops: Vec<Op>,
    /// Source line of each op, for messages.
    pub op_lines: Vec<usize>,
}

/// What one process of an app does in total, computed from the program.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProgramTotals {
    pub write_bytes: u64,
    pub read_bytes: u64,
    pub write_requests: u64,
    pub read_requests: u64,
    pub io_phases: u64,
    pub compute_ns: u64,
    pub barriers: u64,
    pub commits: u64,
}

impl AppSpec {
    /// Resolves the process count against the system's default processes per node.
    pub fn resolve_processes(&self, default_per_node: u32) -> u32 {
        let per_node = self.per_node.unwrap_or(default_per_node);
        match self.nodes {
            Some(n) => n.saturating_mul(per_node),
            None => self.processes,
        }
    }

    /// Per-process totals of the program (loops multiplied out).
    pub fn totals(&self) -> ProgramTotals {
        let mut t = ProgramTotals::default();
        let mut mult: Vec<u64> = vec![1];
        for op in &self.ops {
            let m = *mult.last().unwrap_or(&1);
            match op {
                Op::Compute { ns, .. } => {
                    t.compute_ns = t.compute_ns.saturating_add(ns.saturating_mul(m))
                }
                Op::Write { size, request, .. } => {
                    t.write_bytes = t.write_bytes.saturating_add(size.saturating_mul(m));
                    t.write_requests = t
                        .write_requests
                        .saturating_add(size.div_ceil(*request).saturating_mul(m));
                    t.io_phases = t.io_phases.saturating_add(m);
                }
                Op::Read { size, request, .. } => {
                    t.read_bytes = t.read_bytes.saturating_add(size.saturating_mul(m));
                    t.read_requests = t
                        .read_requests
                        .saturating_add(size.div_ceil(*request).saturating_mul(m));
                    t.io_phases = t.io_phases.saturating_add(m);
                }
                Op::Barrier => t.barriers = t.barriers.saturating_add(m),
                Op::Commit { .. } => t.commits = t.commits.saturating_add(m),
                Op::Repeat { count, .. } => mult.push(m.saturating_mul(u64::from(*count))),
                Op::EndRepeat { .. } => {
                    mult.pop();
                }
            }
        }
        t
    }
}

/// A parsed kernel file.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub apps: Vec<AppSpec>,
    /// Parameters the file declares, with their effective values.
    pub params: BTreeMap<String, String>,
}

/// Parses kernel text. `origin` names the file in errors; `overrides` are `--param` values,
/// which win over the file's `param` defaults.
pub fn parse(
    text: &str,
    origin: &str,
    overrides: &BTreeMap<String, String>,
) -> Result<Kernel, KernelErrors> {
    let mut p = Parser {
        origin,
        overrides,
        params: BTreeMap::new(),
        errors: Vec::new(),
    };
    let apps = p.parse_file(text);
    if p.errors.is_empty() {
        Ok(Kernel {
            apps,
            params: p.params,
        })
    } else {
        Err(KernelErrors(p.errors))
    }
}

struct Parser<'a> {
    origin: &'a str,
    overrides: &'a BTreeMap<String, String>,
    params: BTreeMap<String, String>,
    errors: Vec<KernelError>,
}

/// An app being built, with what was said about it.
struct AppDraft {
    spec: AppSpec,
    line: usize,
    said_processes: bool,
    /// Open `repeat` blocks: index of their `Repeat` op.
    open: Vec<usize>,
}

const STATEMENTS: &str =
    "processes, nodes, per_node, at, file, compute, write, read, barrier, commit, repeat or '}'";

impl Parser<'_> {
    fn err(&mut self, line: usize, message: impl Into<String>) {
        self.errors.push(KernelError {
            origin: self.origin.to_string(),
            line,
            message: message.into(),
        });
    }

    fn parse_file(&mut self, text: &str) -> Vec<AppSpec> {
        let mut apps: Vec<AppSpec> = Vec::new();
        let mut cur: Option<AppDraft> = None;
        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let code = raw.split('#').next().unwrap_or("");
            let toks = tokenize(code);
            if toks.is_empty() {
                continue;
            }
            match cur.as_mut() {
                None => match toks[0] {
                    "param" => self.param(line, &toks),
                    "app" => {
                        if let Some(d) = self.app_header(line, &toks, &apps) {
                            cur = Some(d);
                        }
                    }
                    other => self.err(
                        line,
                        format!("expected 'app NAME {{' or 'param NAME = VALUE', found '{other}'"),
                    ),
                },
                Some(draft) => {
                    if toks == ["}"] {
                        if let Some(start) = draft.open.pop() {
                            let end = draft.spec.ops.len();
                            draft.spec.ops.push(Op::EndRepeat {
                                start: start as u32,
                            });
                            draft.spec.op_lines.push(line);
                            if let Op::Repeat { end: e, .. } = &mut draft.spec.ops[start] {
                                *e = end as u32;
                            }
                        } else if let Some(d) = cur.take() {
                            if let Some(app) = self.finish_app(d) {
                                apps.push(app);
                            }
                        }
                        continue;
                    }
                    let mut draft = match cur.take() {
                        Some(d) => d,
                        None => continue,
                    };
                    self.statement(line, &toks, &mut draft);
                    cur = Some(draft);
                }
            }
        }
        if let Some(d) = cur {
            let msg = if d.open.is_empty() {
                format!("app '{}' is not closed with '}}'", d.spec.name)
            } else {
                format!(
                    "app '{}' has a 'repeat' block that is not closed",
                    d.spec.name
                )
            };
            self.err(d.line, msg);
        }
        if apps.is_empty() && self.errors.is_empty() {
            self.err(1, "no application defined (expected 'app NAME {')");
        }
        apps
    }

    fn param(&mut self, line: usize, toks: &[&str]) {
        // param NAME = VALUE
        if toks.len() != 4 || toks[2] != "=" {
            self.err(line, "expected 'param NAME = VALUE'");
            return;
        }
        let name = toks[1];
        if !is_name(name) {
            self.err(
                line,
                format!("'{name}' is not a parameter name (letters, digits, _)"),
            );
            return;
        }
        let value = self
            .overrides
            .get(name)
            .cloned()
            .unwrap_or_else(|| toks[3].to_string());
        self.params.insert(name.to_string(), value);
    }

    fn app_header(&mut self, line: usize, toks: &[&str], apps: &[AppSpec]) -> Option<AppDraft> {
        if toks.len() != 3 || toks[2] != "{" {
            self.err(line, "expected 'app NAME {'");
            return None;
        }
        let name = toks[1];
        if !is_name(name) {
            self.err(
                line,
                format!("'{name}' is not an application name (letters, digits, _, -)"),
            );
            return None;
        }
        if apps.iter().any(|a| a.name == name) {
            self.err(line, format!("application '{name}' is defined twice"));
        }
        Some(AppDraft {
            spec: AppSpec {
                name: name.to_string(),
                origin: format!("{}:{}", self.origin, line),
                processes: 0,
                per_node: None,
                first_node: None,
                nodes: None,
                files: Vec::new(),
                ops: Vec::new(),
                op_lines: Vec::new(),
            },
            line,
            said_processes: false,
            open: Vec::new(),
        })
    }

    fn finish_app(&mut self, d: AppDraft) -> Option<AppSpec> {
        if !d.said_processes {
            self.err(
                d.line,
                format!(
                    "app '{}' says neither 'processes N' nor 'nodes N'",
                    d.spec.name
                ),
            );
            return None;
        }
        Some(d.spec)
    }

    /// Substitutes `$name` by the parameter's value.
    fn value(&mut self, line: usize, tok: &str) -> Option<String> {
        match tok.strip_prefix('$') {
            Some(name) => match self.params.get(name) {
                Some(v) => Some(v.clone()),
                None => {
                    self.err(
                        line,
                        format!("unknown parameter '${name}' (declare it with 'param {name} = VALUE' above)"),
                    );
                    None
                }
            },
            None => Some(tok.to_string()),
        }
    }

    fn count(&mut self, line: usize, what: &str, tok: &str) -> Option<u32> {
        let v = self.value(line, tok)?;
        match v.replace('_', "").parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => {
                self.err(line, format!("{what}: '{v}' is not a whole number"));
                None
            }
        }
    }

    fn size(&mut self, line: usize, what: &str, tok: &str) -> Option<u64> {
        let v = self.value(line, tok)?;
        match surge_core::parse_size(&v) {
            Ok(n) => Some(n),
            Err(e) => {
                self.err(line, format!("{what}: {e}"));
                None
            }
        }
    }

    fn duration(&mut self, line: usize, what: &str, tok: &str) -> Option<SimTime> {
        let v = self.value(line, tok)?;
        match parse_duration(&v) {
            Ok(n) => Some(n),
            Err(e) => {
                self.err(line, format!("{what}: {e}"));
                None
            }
        }
    }

    fn file_ref(&mut self, line: usize, draft: &AppDraft, name: &str) -> Option<u16> {
        match draft.spec.files.iter().position(|f| f.name == name) {
            Some(i) => Some(i as u16),
            None => {
                let known: Vec<&str> = draft.spec.files.iter().map(|f| f.name.as_str()).collect();
                let hint = if known.is_empty() {
                    "no file is declared yet; add 'file NAME shared' or 'file NAME per_process' first"
                        .to_string()
                } else {
                    format!("declared files: {}", known.join(", "))
                };
                self.err(line, format!("unknown file '{name}' ({hint})"));
                None
            }
        }
    }

    fn push(&mut self, draft: &mut AppDraft, line: usize, op: Op) {
        draft.spec.ops.push(op);
        draft.spec.op_lines.push(line);
    }

    fn statement(&mut self, line: usize, toks: &[&str], d: &mut AppDraft) {
        let args = &toks[1..];
        let want = |n: usize| args.len() == n;
        match toks[0] {
            "processes" | "nodes" => {
                if !want(1) {
                    self.err(line, format!("expected '{} N'", toks[0]));
                    return;
                }
                if d.said_processes {
                    self.err(line, "say either 'processes N' or 'nodes N', once");
                    return;
                }
                // Said, even if the value is bad: one error per mistake, not two.
                d.said_processes = true;
                if let Some(n) = self.count(line, toks[0], args[0]) {
                    if n == 0 {
                        self.err(line, format!("{} must be at least 1", toks[0]));
                        return;
                    }
                    if toks[0] == "processes" {
                        d.spec.processes = n;
                    } else {
                        d.spec.nodes = Some(n);
                    }
                }
            }
            "per_node" => {
                if !want(1) {
                    self.err(line, "expected 'per_node N'");
                    return;
                }
                if let Some(n) = self.count(line, "per_node", args[0]) {
                    if n == 0 {
                        self.err(line, "per_node must be at least 1");
                    } else {
                        d.spec.per_node = Some(n);
                    }
                }
            }
            "at" => {
                if !want(1) {
                    self.err(
                        line,
                        "expected 'at NODE' (the first compute node of the partition)",
                    );
                    return;
                }
                if let Some(n) = self.count(line, "at", args[0]) {
                    d.spec.first_node = Some(n);
                }
            }
            "file" => {
                if !want(2) || !matches!(args[1], "shared" | "per_process") {
                    self.err(
                        line,
                        "expected 'file NAME shared' or 'file NAME per_process'",
                    );
                    return;
                }
                if !is_name(args[0]) {
                    self.err(
                        line,
                        format!("'{}' is not a file name (letters, digits, _, -)", args[0]),
                    );
                    return;
                }
                if d.spec.files.iter().any(|f| f.name == args[0]) {
                    self.err(line, format!("file '{}' is declared twice", args[0]));
                    return;
                }
                if d.spec.files.len() >= 255 {
                    self.err(line, "too many files in one application (at most 255)");
                    return;
                }
                d.spec.files.push(FileSpec {
                    name: args[0].to_string(),
                    shared: args[1] == "shared",
                });
            }
            "compute" => {
                let ok_shape = want(1) || (want(3) && args[1] == "jitter");
                if !ok_shape {
                    self.err(
                        line,
                        "expected 'compute DURATION' or 'compute DURATION jitter PERCENT%'",
                    );
                    return;
                }
                let Some(ns) = self.duration(line, "compute", args[0]) else {
                    return;
                };
                let mut jitter = 0.0;
                if want(3) {
                    let Some(v) = self.value(line, args[2]) else {
                        return;
                    };
                    match v.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) {
                        Some(p) if (0.0..=1000.0).contains(&p) => jitter = p / 100.0,
                        _ => {
                            self.err(
                                line,
                                format!("jitter: '{v}' is not a percentage such as 5%"),
                            );
                            return;
                        }
                    }
                }
                self.push(d, line, Op::Compute { ns, jitter });
            }
            "write" | "read" => {
                let usage = format!("expected '{} FILE SIZE [request SIZE] [strided]'", toks[0]);
                if args.len() < 2 {
                    self.err(line, usage);
                    return;
                }
                let Some(file) = self.file_ref(line, d, args[0]) else {
                    return;
                };
                let Some(size) = self.size(line, toks[0], args[1]) else {
                    return;
                };
                let mut request = size;
                let mut strided = false;
                let mut rest = &args[2..];
                while let Some((&first, tail)) = rest.split_first() {
                    match first {
                        "request" => {
                            let Some(&r) = tail.first() else {
                                self.err(line, usage);
                                return;
                            };
                            let Some(v) = self.size(line, "request", r) else {
                                return;
                            };
                            if v == 0 {
                                self.err(line, "request size must be more than 0");
                                return;
                            }
                            request = v;
                            rest = &tail[1..];
                        }
                        "strided" => {
                            strided = true;
                            rest = tail;
                        }
                        other => {
                            self.err(line, format!("unexpected '{other}'; {usage}"));
                            return;
                        }
                    }
                }
                if size == 0 {
                    // A zero-size phase (e.g. `write out $chunk` with chunk = 0) does nothing.
                    return;
                }
                request = request.min(size);
                let op = if toks[0] == "write" {
                    Op::Write {
                        file,
                        size,
                        request,
                        strided,
                    }
                } else {
                    Op::Read {
                        file,
                        size,
                        request,
                        strided,
                    }
                };
                self.push(d, line, op);
            }
            "barrier" => {
                if !want(0) {
                    self.err(line, "'barrier' takes no arguments");
                    return;
                }
                self.push(d, line, Op::Barrier);
            }
            "commit" => {
                if args.len() > 1 {
                    self.err(line, "expected 'commit' or 'commit FILE'");
                    return;
                }
                let file = match args.first() {
                    Some(name) => match self.file_ref(line, d, name) {
                        Some(f) => Some(f),
                        None => return,
                    },
                    None => None,
                };
                self.push(d, line, Op::Commit { file });
            }
            "repeat" => {
                if !(want(2) && args[1] == "{") {
                    self.err(line, "expected 'repeat N {'");
                    return;
                }
                if d.open.len() >= MAX_REPEAT_DEPTH {
                    self.err(
                        line,
                        format!("repeat blocks nest at most {MAX_REPEAT_DEPTH} deep"),
                    );
                }
                // A bad count still opens the block, so the '}' that follows does not close
                // the app and every later line is reported correctly.
                let count = self.count(line, "repeat", args[0]).unwrap_or(0);
                d.open.push(d.spec.ops.len());
                self.push(d, line, Op::Repeat { count, end: 0 });
            }
            other => self.err(
                line,
                format!("unknown statement '{other}' (expected {STATEMENTS})"),
            ),
        }
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !s.starts_with('-')
}

/// Splits a line into words, with `{`, `}` and `=` as words of their own.
fn tokenize(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for word in code.split_whitespace() {
        let mut rest = word;
        while !rest.is_empty() {
            match rest.find(['{', '}', '=']) {
                Some(0) => {
                    out.push(&rest[..1]);
                    rest = &rest[1..];
                }
                Some(i) => {
                    out.push(&rest[..i]);
                    rest = &rest[i..];
                }
                None => {
                    out.push(rest);
                    rest = "";
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Kernel {
        parse(text, "k.kernel", &BTreeMap::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn errs(text: &str) -> String {
        parse(text, "k.kernel", &BTreeMap::new())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_an_ior_kernel() {
        let k = ok("
# IOR, as in Liu Fig. 3
param procs = 2048
app ior {
    processes $procs
    per_node 4
    file out shared
    repeat 4 {
        write out 4MiB
    }
    barrier
}
");
        assert_eq!(k.apps.len(), 1);
        let a = &k.apps[0];
        assert_eq!(a.processes, 2048);
        assert_eq!(a.per_node, Some(4));
        assert_eq!(
            a.files,
            vec![FileSpec {
                name: "out".into(),
                shared: true
            }]
        );
        assert_eq!(
            a.ops,
            vec![
                Op::Repeat { count: 4, end: 2 },
                Op::Write {
                    file: 0,
                    size: 4 << 20,
                    request: 4 << 20,
                    strided: false
                },
                Op::EndRepeat { start: 0 },
                Op::Barrier,
            ]
        );
        assert_eq!(a.op_lines, vec![8, 9, 10, 11]);
        let t = a.totals();
        assert_eq!(t.write_bytes, 16 << 20);
        assert_eq!(t.write_requests, 4);
        assert_eq!(t.io_phases, 4);
    }

    #[test]
    fn params_are_overridden_from_the_command_line() {
        let mut o = BTreeMap::new();
        o.insert("procs".to_string(), "64".to_string());
        let k = parse(
            "param procs = 2048\napp a {\nprocesses $procs\nfile f per_process\nwrite f 1MiB request 256KiB strided\n}\n",
            "k",
            &o,
        )
        .unwrap();
        assert_eq!(k.apps[0].processes, 64);
        assert_eq!(k.params["procs"], "64");
        assert_eq!(
            k.apps[0].ops[0],
            Op::Write {
                file: 0,
                size: 1 << 20,
                request: 256 << 10,
                strided: true
            }
        );
        assert_eq!(k.apps[0].totals().write_requests, 4);
    }

    #[test]
    fn nested_loops_multiply_out() {
        let k = ok("app a {
nodes 2
file f shared
repeat 3 {
  compute 10s jitter 5%
  repeat 2 {
    write f 1MiB
    read f 1MiB
  }
  commit f
}
}");
        let a = &k.apps[0];
        assert_eq!(a.nodes, Some(2));
        assert_eq!(a.resolve_processes(4), 8);
        let t = a.totals();
        assert_eq!(t.compute_ns, 30_000_000_000);
        assert_eq!(t.write_bytes, 6 << 20);
        assert_eq!(t.read_bytes, 6 << 20);
        assert_eq!(t.commits, 3);
        assert_eq!(
            a.ops[1],
            Op::Compute {
                ns: 10_000_000_000,
                jitter: 0.05
            }
        );
    }

    #[test]
    fn zero_sized_phases_vanish() {
        let k = ok(
            "param chunk = 0\napp a {\nprocesses 1\nfile f shared\nwrite f $chunk\ncompute 1s\n}",
        );
        assert_eq!(k.apps[0].ops.len(), 1);
    }

    #[test]
    fn errors_name_file_line_and_value() {
        let e = errs("app a {\nprocesses 4\nfile f shared\nwirte f 4MiB\n}");
        assert_eq!(
            e,
            "k.kernel:4: unknown statement 'wirte' (expected processes, nodes, per_node, at, file, compute, write, read, barrier, commit, repeat or '}')"
        );
        let e = errs("app a {\nprocesses 4\nfile f shared\nwrite g 4MiB\n}");
        assert!(
            e.starts_with("k.kernel:4: unknown file 'g' (declared files: f)"),
            "{e}"
        );
        let e = errs("app a {\nprocesses 4\nfile f shared\nwrite f 4XB\n}");
        assert!(
            e.starts_with("k.kernel:4: write:") && e.contains("4XB"),
            "{e}"
        );
        let e = errs("app a {\nprocesses 4\ncompute 300\n}");
        assert!(
            e.starts_with("k.kernel:3: compute:") && e.contains("no unit"),
            "{e}"
        );
        let e = errs("app a {\nprocesses $n\n}");
        assert!(e.contains("k.kernel:2: unknown parameter '$n'"), "{e}");
    }

    #[test]
    fn several_errors_are_reported_together() {
        let e =
            errs("app a {\nprocesses x\nfile f nowhere\nrepeat two {\nbarrier\n}\nbarrier 3\n}");
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 4, "{e}");
        assert!(lines[0].starts_with("k.kernel:2:"));
        assert!(lines[1].starts_with("k.kernel:3:"));
        assert!(lines[2].starts_with("k.kernel:4:"));
        assert!(lines[3].starts_with("k.kernel:7:"));
    }

    #[test]
    fn structure_errors() {
        assert!(errs("app a {\nprocesses 1\n").contains("k.kernel:1: app 'a' is not closed"));
        assert!(errs("app a {\nprocesses 1\nrepeat 2 {\nbarrier\n}")
            .contains("k.kernel:1: app 'a' is not closed"));
        assert!(errs("app a {\nprocesses 1\nrepeat 2 {\nbarrier\n")
            .contains("repeat' block that is not closed"));
        assert!(errs("app a {\nfile f shared\n}").contains("neither 'processes N' nor 'nodes N'"));
        assert!(errs("# nothing\n").contains("no application defined"));
        assert!(errs("app a {\nprocesses 1\n}\napp a {\nprocesses 1\n}")
            .contains("k.kernel:4: application 'a' is defined twice"));
        assert!(errs("write f 1MiB").contains("k.kernel:1: expected 'app NAME {'"));
    }

    #[test]
    fn repeat_nesting_is_bounded() {
        let mut text = String::from("app a {\nprocesses 1\n");
        for _ in 0..=MAX_REPEAT_DEPTH {
            text.push_str("repeat 2 {\n");
        }
        text.push_str("barrier\n");
        for _ in 0..=MAX_REPEAT_DEPTH {
            text.push_str("}\n");
        }
        text.push_str("}\n");
        let e = errs(&text);
        assert!(
            e.contains(&format!(
                "k.kernel:{}: repeat blocks nest at most",
                MAX_REPEAT_DEPTH + 3
            )),
            "{e}"
        );
    }

    #[test]
    fn braces_need_no_spaces() {
        let k = ok("app a{\nprocesses 1\nrepeat 2{\nbarrier\n}\n}");
        assert_eq!(k.apps[0].ops.len(), 3);
        let k = ok("param x=3\napp a {\nprocesses $x\n}");
        assert_eq!(k.apps[0].processes, 3);
    }
}
