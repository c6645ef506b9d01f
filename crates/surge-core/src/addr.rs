//! Addresses a server is known by: what other hosts can reach. A server listening on a wildcard
//! address (`0.0.0.0:7070`, `[::]:7070`) must say which of its addresses others use
//! (`surge server --advertise`), or every client would connect to its own host.

use std::net::SocketAddr;

/// Why `addr` (`host:port`, or `unix:/path`) cannot be given to clients on other hosts, if it
/// cannot: a wildcard IP, a port 0, or no port.
pub fn unroutable(addr: &str) -> Option<String> {
    if addr.starts_with("unix:") {
        return None;
    }
    match addr.parse::<SocketAddr>() {
        Ok(sa) if sa.ip().is_unspecified() => Some(format!(
            "{addr} is a wildcard address: clients would connect to their own host (give the \
             server --advertise HOST:PORT, an address the other hosts can reach)"
        )),
        Ok(sa) if sa.port() == 0 => Some(format!("{addr} has no port")),
        Ok(_) => None,
        Err(_) => match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
                None
            }
            _ => Some(format!("{addr} is not HOST:PORT")),
        },
    }
}

/// The address to advertise for a server bound to `bound` (`ip:port`) when asked for
/// `advertise` (`HOST` or `HOST:PORT`; the bound port when none is given).
pub fn advertised(advertise: &str, bound: &str) -> String {
    let port = bound.rsplit_once(':').map(|(_, p)| p).unwrap_or("");
    if advertise.starts_with('[') {
        return match advertise.contains("]:") {
            true => advertise.to_string(),
            false => format!("{advertise}:{port}"),
        };
    }
    match advertise.matches(':').count() {
        0 => format!("{advertise}:{port}"),
        1 => advertise.to_string(),
        // A bare IPv6 address.
        _ => format!("[{advertise}]:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_and_port_zero_are_unroutable_names_and_ips_are_not() {
        assert!(unroutable("0.0.0.0:7070").is_some());
        assert!(unroutable("[::]:7070").is_some());
        assert!(unroutable("10.0.0.5:0").is_some());
        assert!(unroutable("bb1").is_some());
        assert_eq!(unroutable("10.0.0.5:7070"), None);
        assert_eq!(unroutable("127.0.0.1:7070"), None);
        assert_eq!(unroutable("bb1.cluster:7070"), None);
        assert_eq!(unroutable("unix:/run/surge/bb1.sock"), None);
    }

    #[test]
    fn the_bound_port_is_advertised_unless_one_is_given() {
        assert_eq!(advertised("10.0.0.5", "0.0.0.0:7070"), "10.0.0.5:7070");
        assert_eq!(advertised("bb1:9000", "0.0.0.0:7070"), "bb1:9000");
        assert_eq!(advertised("fd00::5", "[::]:7070"), "[fd00::5]:7070");
        assert_eq!(advertised("[fd00::5]:9000", "[::]:7070"), "[fd00::5]:9000");
    }
}
