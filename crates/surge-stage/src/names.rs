//! Temporary names. A file being staged is written as `.surge-stage.<name>.<8 hex digits>` in
//! its destination directory and renamed onto `<name>` once complete, so no reader ever sees a
//! half-written file under its real name. The pattern is recognisable: a later stage over the
//! same destination removes what an interrupted one left, and scans skip such names in sources.

/// What every temporary name starts with.
pub const TEMP_PREFIX: &str = ".surge-stage.";
/// Longest file name most file systems (and the metadata service) accept.
const NAME_MAX: usize = 255;
const SUFFIX_LEN: usize = 9; // '.' and 8 hex digits

/// A fresh temporary name for `name`. Long names are cut so the result fits in NAME_MAX bytes
/// (the random suffix keeps it unique).
pub(crate) fn temp_name(name: &[u8]) -> Vec<u8> {
    let room = NAME_MAX - TEMP_PREFIX.len() - SUFFIX_LEN;
    let mut out = Vec::with_capacity(NAME_MAX);
    out.extend_from_slice(TEMP_PREFIX.as_bytes());
    out.extend_from_slice(&name[..name.len().min(room)]);
    out.extend_from_slice(format!(".{:08x}", fastrand::u32(..)).as_bytes());
    out
}

/// True for a name made by [`temp_name`].
pub fn is_temp_name(name: &[u8]) -> bool {
    if name.len() < TEMP_PREFIX.len() + SUFFIX_LEN || !name.starts_with(TEMP_PREFIX.as_bytes()) {
        return false;
    }
    let suffix = &name[name.len() - SUFFIX_LEN..];
    suffix[0] == b'.' && suffix[1..].iter().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_recognised_and_fit() {
        let t = temp_name(b"a.dat");
        assert!(t.starts_with(b".surge-stage.a.dat."));
        assert!(is_temp_name(&t));
        let long = vec![b'x'; 255];
        let t = temp_name(&long);
        assert_eq!(t.len(), 255);
        assert!(is_temp_name(&t));
    }

    #[test]
    fn ordinary_names_are_not_temporaries() {
        assert!(!is_temp_name(b"a.dat"));
        assert!(!is_temp_name(b".surge-stage."));
        assert!(!is_temp_name(b".surge-stage.a.dat"));
        assert!(!is_temp_name(b".surge-stage.a.dat.1234567g"));
        assert!(!is_temp_name(b"x.surge-stage.a.dat.12345678"));
    }
}
