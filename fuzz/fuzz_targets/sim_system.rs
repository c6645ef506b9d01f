//! `surge sim` system descriptions (TOML) with `--set` overrides: errors, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The description, then (after a NUL byte) one override per line.
    let (toml, sets) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let toml = String::from_utf8_lossy(toml);
    let sets: Vec<String> = String::from_utf8_lossy(sets)
        .lines()
        .take(8)
        .map(str::to_string)
        .collect();
    if let Ok(s) = surge_sim::system::System::from_toml(&toml, "fuzz.toml", &sets) {
        let _ = (s.ions(), s.luns());
        for cn in 0..4 {
            let _ = s.ion_of(cn);
        }
    }
});
