//! The metadata store's schema, as numbered steps (issue 33 item 3).
//!
//! A store records the last step it has taken in SQLite's `user_version`. Opening it runs the
//! steps after that one, each in its own transaction with the new version, so a store is always
//! at one numbered version and a crash mid-upgrade leaves it at the step before. A store made
//! by a newer Surge (a version past [`VERSION`]) is refused, naming both versions, rather than
//! used by code that does not know its columns.
//!
//! To change the schema: append a step. Never edit one that has shipped.

use rusqlite::{Connection, OptionalExtension};

/// One step of the schema.
pub struct Step {
    pub version: i64,
    /// What the step adds, for the log and for people.
    pub what: &'static str,
    pub sql: &'static str,
}

/// Every step, in order; `STEPS[i].version == i + 1`.
pub const STEPS: &[Step] = &[
    Step {
        version: 1,
        what: "inodes, directory entries, extended attributes, the drain journal and its hold",
        sql: "CREATE TABLE IF NOT EXISTS inodes(
                ino INTEGER PRIMARY KEY AUTOINCREMENT,
                kind INTEGER NOT NULL, perm INTEGER NOT NULL, nlink INTEGER NOT NULL,
                uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL,
                atime_s INTEGER NOT NULL, atime_ns INTEGER NOT NULL,
                mtime_s INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
                ctime_s INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
                parent INTEGER NOT NULL,
                target BLOB);
              CREATE TABLE IF NOT EXISTS dentries(
                id INTEGER PRIMARY KEY,
                parent INTEGER NOT NULL, name BLOB NOT NULL,
                ino INTEGER NOT NULL, kind INTEGER NOT NULL,
                UNIQUE(parent, name));
              CREATE INDEX IF NOT EXISTS dentries_by_parent ON dentries(parent, id);
              CREATE TABLE IF NOT EXISTS xattrs(
                ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
                PRIMARY KEY(ino, name)) WITHOUT ROWID;
              CREATE TABLE IF NOT EXISTS drain(
                seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL,
                data_ino INTEGER, taken INTEGER NOT NULL DEFAULT 0,
                moves INTEGER NOT NULL DEFAULT 0);
              CREATE INDEX IF NOT EXISTS drain_data ON drain(data_ino)
                WHERE data_ino IS NOT NULL;
              CREATE TABLE IF NOT EXISTS drain_hold(
                one INTEGER PRIMARY KEY CHECK (one = 0), session INTEGER NOT NULL,
                at_ms INTEGER NOT NULL);",
    },
    Step {
        version: 2,
        what: "a change counter per directory (directory leases)",
        sql: "ALTER TABLE inodes ADD COLUMN change INTEGER NOT NULL DEFAULT 0;",
    },
    Step {
        version: 3,
        what: "device numbers (special files)",
        sql: "ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0;",
    },
    Step {
        version: 4,
        what: "cache files written through to the PFS",
        sql: "ALTER TABLE inodes ADD COLUMN through INTEGER NOT NULL DEFAULT 0;",
    },
    Step {
        version: 5,
        what: "a layout per file",
        sql: "ALTER TABLE inodes ADD COLUMN stripe_size INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE inodes ADD COLUMN stripe_count INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE inodes ADD COLUMN stripe_start INTEGER NOT NULL DEFAULT 0;",
    },
    Step {
        version: 6,
        what: "clean cache files eviction may take",
        sql: "ALTER TABLE inodes ADD COLUMN clean INTEGER NOT NULL DEFAULT 0;
              CREATE INDEX IF NOT EXISTS inodes_clean ON inodes(ino) WHERE clean = 1;",
    },
    Step {
        version: 7,
        what: "where a journaled copy came from (copies move after a write-through)",
        sql: "ALTER TABLE drain ADD COLUMN origin INTEGER;",
    },
    Step {
        version: 8,
        what: "the bytes extended attributes take, kept by triggers",
        sql: "CREATE TABLE IF NOT EXISTS xattr_bytes(
                one INTEGER PRIMARY KEY CHECK (one = 0), bytes INTEGER NOT NULL);
              INSERT OR IGNORE INTO xattr_bytes(one, bytes)
                SELECT 0, COALESCE(SUM(length(name) + length(value)), 0) FROM xattrs;
              CREATE TRIGGER IF NOT EXISTS xattr_bytes_insert AFTER INSERT ON xattrs BEGIN
                UPDATE xattr_bytes SET bytes = bytes + length(NEW.name) + length(NEW.value);
              END;
              CREATE TRIGGER IF NOT EXISTS xattr_bytes_update AFTER UPDATE ON xattrs BEGIN
                UPDATE xattr_bytes SET bytes = bytes + length(NEW.name) + length(NEW.value)
                    - length(OLD.name) - length(OLD.value);
              END;
              CREATE TRIGGER IF NOT EXISTS xattr_bytes_delete AFTER DELETE ON xattrs BEGIN
                UPDATE xattr_bytes SET bytes = bytes - length(OLD.name) - length(OLD.value);
              END;",
    },
    Step {
        version: 9,
        what: "files made by O_TMPFILE and never named",
        sql: "ALTER TABLE inodes ADD COLUMN unnamed INTEGER NOT NULL DEFAULT 0;",
    },
    Step {
        version: 10,
        what: "birth times (statx's btime; 0 for files made before)",
        sql: "ALTER TABLE inodes ADD COLUMN btime_s INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE inodes ADD COLUMN btime_ns INTEGER NOT NULL DEFAULT 0;",
    },
    Step {
        version: 11,
        what: "chattr flags (immutable, append-only, no-dump, no-atime)",
        sql: "ALTER TABLE inodes ADD COLUMN flags INTEGER NOT NULL DEFAULT 0;",
    },
];

/// The version this code writes and reads.
pub const VERSION: i64 = STEPS.len() as i64;

const _: () = {
    let mut i = 0;
    while i < STEPS.len() {
        assert!(
            STEPS[i].version == i as i64 + 1,
            "steps are numbered 1, 2, ... in order"
        );
        i += 1;
    }
};

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the metadata store is at schema version {found}, made by a newer Surge; this one \
         knows versions up to {VERSION} (run the newer surge, or start from an empty store)"
    )]
    Newer { found: i64 },
    #[error("schema step {version} ({what}): {source}")]
    Step {
        version: i64,
        what: &'static str,
        source: rusqlite::Error,
    },
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
}

/// Brings the store up to [`VERSION`]; returns the version it was at.
pub fn upgrade(conn: &Connection) -> Result<i64, SchemaError> {
    let mut at: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let from = at;
    if at > VERSION {
        return Err(SchemaError::Newer { found: at });
    }
    if at == 0 && table_exists(conn, "inodes")? {
        at = unnumbered(conn)?;
    }
    for step in &STEPS[usize::try_from(at).unwrap_or(0)..] {
        let run = || -> rusqlite::Result<()> {
            let tx = conn.unchecked_transaction()?;
            tx.execute_batch(step.sql)?;
            tx.pragma_update(None, "user_version", step.version)?;
            tx.commit()
        };
        run().map_err(|source| SchemaError::Step {
            version: step.version,
            what: step.what,
            source,
        })?;
    }
    Ok(from)
}

/// The version of a store made before stores were numbered: the steps whose columns and
/// tables it has, in order (they were added in this order). Tables of step 1 it lacks are
/// made first.
fn unnumbered(conn: &Connection) -> Result<i64, SchemaError> {
    conn.execute_batch(STEPS[0].sql)?;
    let checks: [(&str, &str); 7] = [
        ("inodes", "change"),
        ("inodes", "rdev"),
        ("inodes", "through"),
        ("inodes", "stripe_start"),
        ("inodes", "clean"),
        ("drain", "origin"),
        ("xattr_bytes", "bytes"),
    ];
    let mut version = 1;
    for (table, column) in checks {
        if !has_column(conn, table, column)? {
            break;
        }
        version += 1;
    }
    // Step 6's index came with its column; make sure of it before skipping the step.
    if version >= 6 {
        conn.execute_batch(
            "CREATE INDEX IF NOT EXISTS inodes_clean ON inodes(ino) WHERE clean = 1;",
        )?;
    }
    if version >= 8 {
        // The triggers came with the table (step 8 is all "if not exists").
        conn.execute_batch(STEPS[7].sql)?;
    }
    Ok(version)
}

fn table_exists(conn: &Connection, table: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [table],
        |_| Ok(()),
    )
    .optional()
    .map(|r| r.is_some())
}

fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(c: &Connection) -> i64 {
        c.pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap()
    }

    fn columns(c: &Connection, table: &str) -> Vec<String> {
        let mut st = c
            .prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")
            .unwrap();
        st.query_map([table], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn a_new_store_takes_every_step_and_a_second_open_none() {
        let c = Connection::open_in_memory().unwrap();
        assert_eq!(upgrade(&c).unwrap(), 0);
        assert_eq!(version(&c), VERSION);
        assert!(columns(&c, "inodes").contains(&"clean".to_string()));
        assert!(columns(&c, "drain").contains(&"origin".to_string()));
        assert!(columns(&c, "inodes").contains(&"unnamed".to_string()));
        assert_eq!(upgrade(&c).unwrap(), VERSION);
    }

    #[test]
    fn a_store_made_before_numbers_gets_the_steps_it_lacks() {
        // As stores were between layouts per file (step 5) and eviction (step 6).
        let c = Connection::open_in_memory().unwrap();
        for step in &STEPS[..5] {
            c.execute_batch(step.sql).unwrap();
        }
        c.execute_batch(
            "INSERT INTO inodes(ino, kind, perm, nlink, uid, gid, size, atime_s, atime_ns,
                mtime_s, mtime_ns, ctime_s, ctime_ns, parent, stripe_size)
             VALUES (1, 2, 493, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 65536);
             INSERT INTO xattrs VALUES (1, x'61', x'6263');",
        )
        .unwrap();
        assert_eq!(version(&c), 0);
        assert_eq!(unnumbered(&c).unwrap(), 5);
        upgrade(&c).unwrap();
        assert_eq!(version(&c), VERSION);
        let (stripe, bytes): (i64, i64) = c
            .query_row(
                "SELECT stripe_size, (SELECT bytes FROM xattr_bytes) FROM inodes WHERE ino = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            (stripe, bytes),
            (65536, 3),
            "rows kept, attribute bytes summed"
        );
    }

    #[test]
    fn a_store_of_a_newer_surge_is_refused_untouched() {
        let c = Connection::open_in_memory().unwrap();
        upgrade(&c).unwrap();
        c.pragma_update(None, "user_version", VERSION + 1).unwrap();
        let e = upgrade(&c).unwrap_err();
        assert!(matches!(e, SchemaError::Newer { found } if found == VERSION + 1));
        assert!(e.to_string().contains("newer Surge"), "{e}");
        assert_eq!(version(&c), VERSION + 1);
    }

    #[test]
    fn a_failed_step_leaves_the_store_at_the_step_before() {
        let c = Connection::open_in_memory().unwrap();
        for step in &STEPS[..2] {
            c.execute_batch(step.sql).unwrap();
        }
        c.pragma_update(None, "user_version", 2).unwrap();
        // Step 3's column is already there (made by hand): its ALTER fails.
        c.execute_batch("ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0;")
            .unwrap();
        let e = upgrade(&c).unwrap_err();
        assert!(matches!(e, SchemaError::Step { version: 3, .. }), "{e}");
        assert_eq!(version(&c), 2);
    }
}
