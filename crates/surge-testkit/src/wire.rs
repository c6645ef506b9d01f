//! A recording TCP proxy ("the wire"): every byte a client and the service behind it
//! exchange passes through it and is kept, so a test can say what a capture would show.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// A TCP proxy from a loopback port to `to` that keeps every byte either way.
pub struct Proxy {
    /// Where clients connect (`127.0.0.1:PORT`).
    pub addr: String,
    wire: Arc<Mutex<Vec<u8>>>,
}

impl Proxy {
    pub fn start(to: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
        let addr = l.local_addr().expect("proxy address").to_string();
        let wire = Arc::new(Mutex::new(Vec::new()));
        let w = wire.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let Ok(s) = TcpStream::connect(&to) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (c.try_clone(), s.try_clone()) else {
                    continue;
                };
                for (mut from, mut into) in [(c2, s2), (s, c)] {
                    let w = w.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 65536];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || into.write_all(&buf[..n]).is_err() {
                                break;
                            }
                            w.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .extend_from_slice(&buf[..n]);
                        }
                        let _ = into.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Proxy { addr, wire }
    }

    /// What crossed since the last call.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.wire.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// True when `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
