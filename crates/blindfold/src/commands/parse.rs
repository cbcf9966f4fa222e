//! Value parsers of flags several commands share: sizes, counts and listen addresses.

/// Parses a size in bytes (`1GiB`, `512MiB`, `65536`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    blindfold_gateway::server::parse_size(s)
}

/// Parses a block size (`4KiB`, `65536`) that fits the engine's 32-bit block size.
pub fn parse_block_size(s: &str) -> Result<u32, String> {
    let b = blindfold_gateway::server::parse_size(s)?;
    u32::try_from(b).map_err(|_| format!("block size {b} is too large"))
}

/// Parses `1000`, `2^20` or `64k`/`1M` (binary multiples).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim().replace('_', "");
    if let Some((base, exp)) = s.split_once('^') {
        let base: u64 = base.parse().map_err(|_| format!("bad base in {s:?}"))?;
        let exp: u32 = exp.parse().map_err(|_| format!("bad exponent in {s:?}"))?;
        return base.checked_pow(exp).ok_or_else(|| format!("{s} is too large"));
    }
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s.as_str(), 1),
    };
    let n: u64 =
        num.parse().map_err(|_| format!("{s:?} is not a count (try 1000, 2^20 or 64k)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s} is too large"))
}

/// Parses `--listen`: `host:port` (host a name or an address) or a bare port on 127.0.0.1.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let s = s.trim();
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let bad = || {
        format!("{s:?} is not an address to listen on (try 9100, localhost:9100 or 0.0.0.0:9100)")
    };
    if !s.contains(':') {
        return Err(bad());
    }
    let mut addrs = s.to_socket_addrs().map_err(|e| format!("{}: {e}", bad()))?;
    addrs.next().ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(parse_listen("19412").unwrap(), "127.0.0.1:19412".parse().unwrap());
        assert_eq!(parse_listen("0.0.0.0:80").unwrap(), "0.0.0.0:80".parse().unwrap());
        assert!(parse_listen("localhost:19412").unwrap().ip().is_loopback());
        assert!(parse_listen("nonsense").is_err());
        assert!(parse_listen("99999").is_err());
    }

    #[test]
    fn counts_parse() {
        assert_eq!(parse_count("1000"), Ok(1000));
        assert_eq!(parse_count("2^20"), Ok(1 << 20));
        assert_eq!(parse_count("64k"), Ok(65536));
        assert_eq!(parse_count("1_000"), Ok(1000));
        assert!(parse_count("2^99").is_err());
        assert!(parse_count("lots").is_err());
    }
}
