//! Message sizes: parsing `16KiB`-style values and the power-of-two size classes the cache keys on.

use super::RouteError;

/// The largest size class: messages of 2^40 bytes (1 TiB) and above share it.
pub const MAX_SIZE_CLASS: u8 = 40;

/// The size class of a message: the exponent of the next power of two (`0` for 0 and 1 byte).
///
/// Decisions are made for the class's upper bound ([`class_bytes`]) so that a cached decision
/// does not depend on which size of the class happened to be asked first.
pub fn size_class(bytes: u64) -> u8 {
    if bytes <= 1 {
        return 0;
    }
    let class = 64 - (bytes - 1).leading_zeros();
    class.min(u32::from(MAX_SIZE_CLASS)) as u8
}

/// The message size a class stands for: `2^class` bytes.
pub fn class_bytes(class: u8) -> u64 {
    1u64 << class.min(MAX_SIZE_CLASS)
}

/// Parses a byte count: `4096`, `4k`, `4KiB`, `16K`, `1MiB`, `1m`, `2GiB`, `1TiB` (binary units, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64, RouteError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad =
        |reason: &str| RouteError::Parse { what: "size", value: text.to_owned(), reason: format!("{reason}; write bytes like 1024, 16KiB, 1MiB") };
    let n: u64 = digits.parse().map_err(|_| bad("no leading number"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad("unknown unit")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| bad("too large"))
}

/// Formats a byte count with the largest exact binary unit (`16 KiB`, `1 MiB`, `3000 B`).
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_next_power_of_two() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 0);
        assert_eq!(size_class(2), 1);
        assert_eq!(size_class(1024), 10);
        assert_eq!(size_class(1025), 11);
        assert_eq!(class_bytes(size_class(3000)), 4096);
        assert_eq!(size_class(u64::MAX), MAX_SIZE_CLASS);
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("16KiB").ok(), Some(16384));
        assert_eq!(parse_size("1m").ok(), Some(1 << 20));
        assert_eq!(parse_size(" 2 GiB ").ok(), Some(2 << 30));
        assert_eq!(parse_size("1TiB").ok(), Some(1 << 40));
        assert!(parse_size("20000000TiB").is_err(), "overflow is an error");
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert_eq!(format_size(16384), "16 KiB");
        assert_eq!(format_size(3000), "3000 B");
    }
}
