//! Parsing and printing of sizes, durations and bandwidths for flags and
//! reports. Decimal (SI) units are the default everywhere: 1 KB = 1000 B,
//! 1 TB = 10^12 B, 1 Gbps = 10^9 bit/s; binary units (KiB, MiB, GiB, TiB)
//! are accepted on input only. It must never guess a unit: a bare number is
//! bytes for sizes and an error for durations.

use thiserror::Error;

/// Why a size, duration or bandwidth flag was rejected.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum UnitError {
    #[error("{input:?}: empty value")]
    Empty { input: String },
    #[error("{input:?}: not a number followed by a unit")]
    BadNumber { input: String },
    #[error("{input:?}: unknown unit {unit:?} (expected one of {expected})")]
    UnknownUnit {
        input: String,
        unit: String,
        expected: &'static str,
    },
    #[error("{input:?}: out of range")]
    OutOfRange { input: String },
}

const SIZE_UNITS: &str = "B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB";
const DURATION_UNITS: &str = "ms, s, m, h, d";
const BANDWIDTH_UNITS: &str = "bps, Kbps, Mbps, Gbps, Tbps, B/s, KB/s, MB/s, GB/s";

/// Splits "1.5TB" into (1.5, "TB"). The number may have a fraction.
fn split_number(input: &str) -> Result<(f64, &str), UnitError> {
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(UnitError::Empty {
            input: input.to_string(),
        });
    }
    let split_at = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(trimmed.len());
    let (number_text, unit) = trimmed.split_at(split_at);
    let number: f64 = number_text
        .replace('_', "")
        .parse()
        .map_err(|_| UnitError::BadNumber {
            input: input.to_string(),
        })?;
    if !number.is_finite() || number < 0.0 {
        return Err(UnitError::OutOfRange {
            input: input.to_string(),
        });
    }
    Ok((number, unit.trim()))
}

fn to_u64(input: &str, value: f64) -> Result<u64, UnitError> {
    let rounded = value.round();
    // 2^64 is exactly representable; anything at or above it does not fit.
    if !(0.0..18_446_744_073_709_551_616.0).contains(&rounded) {
        return Err(UnitError::OutOfRange {
            input: input.to_string(),
        });
    }
    Ok(rounded as u64)
}

/// Parses a size such as `500`, `500B`, `1KB` (1000 B), `1KiB` (1024 B),
/// `20TB` or `18TiB` into bytes. Unit letters are case-insensitive except
/// that `b` means bytes here (sizes are never in bits).
pub fn parse_size_bytes(input: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(input)?;
    let multiplier: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "pb" | "p" => 1e15,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "pib" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(UnitError::UnknownUnit {
                input: input.to_string(),
                unit: unit.to_string(),
                expected: SIZE_UNITS,
            })
        }
    };
    to_u64(input, number * multiplier)
}

/// Parses a duration such as `500ms`, `60s`, `30m`, `12h`, `7d` or
/// `604800s` into milliseconds. A unit is required.
pub fn parse_duration_ms(input: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(input)?;
    let multiplier_ms: f64 = match unit {
        "ms" => 1.0,
        "s" => 1e3,
        "m" | "min" => 60e3,
        "h" => 3_600e3,
        "d" => 86_400e3,
        _ => {
            return Err(UnitError::UnknownUnit {
                input: input.to_string(),
                unit: unit.to_string(),
                expected: DURATION_UNITS,
            })
        }
    };
    to_u64(input, number * multiplier_ms)
}

/// Parses a network bandwidth into bytes per second: `10Gbps` (bits,
/// decimal: 1.25e9 B/s) or `1.25GB/s` (bytes). The case of `b`/`B` matters
/// here, so only the spellings listed in the error are accepted.
pub fn parse_bandwidth_bytes_per_s(input: &str) -> Result<f64, UnitError> {
    let (number, unit) = split_number(input)?;
    let bytes_per_unit: f64 = match unit {
        "bps" => 1.0 / 8.0,
        "Kbps" | "kbps" => 1e3 / 8.0,
        "Mbps" => 1e6 / 8.0,
        "Gbps" => 1e9 / 8.0,
        "Tbps" => 1e12 / 8.0,
        "B/s" => 1.0,
        "KB/s" | "kB/s" => 1e3,
        "MB/s" => 1e6,
        "GB/s" => 1e9,
        _ => {
            return Err(UnitError::UnknownUnit {
                input: input.to_string(),
                unit: unit.to_string(),
                expected: BANDWIDTH_UNITS,
            })
        }
    };
    let bytes_per_s = number * bytes_per_unit;
    if bytes_per_s <= 0.0 {
        return Err(UnitError::OutOfRange {
            input: input.to_string(),
        });
    }
    Ok(bytes_per_s)
}

/// Formats a byte count in decimal units with two decimals: `302.40 TB`.
pub fn format_bytes_decimal(bytes: f64) -> String {
    const STEPS: [(f64, &str); 5] = [
        (1e15, "PB"),
        (1e12, "TB"),
        (1e9, "GB"),
        (1e6, "MB"),
        (1e3, "KB"),
    ];
    for (scale, unit) in STEPS {
        if bytes >= scale {
            return format!("{:.2} {unit}", bytes / scale);
        }
    }
    format!("{bytes:.0} B")
}

/// Formats a byte rate in decimal units: `1.50 GB/s`.
pub fn format_bytes_per_s_decimal(bytes_per_s: f64) -> String {
    format!("{}/s", format_bytes_decimal(bytes_per_s))
}

/// Formats an integer with thousands separators: `1,000,000`.
pub fn format_thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Formats milliseconds as the shortest of `7d`, `12h`, `90s`, `250ms`.
pub fn format_duration_ms(duration_ms: u64) -> String {
    const STEPS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (scale, unit) in STEPS {
        if duration_ms >= scale && duration_ms.is_multiple_of(scale) {
            return format!("{}{unit}", duration_ms / scale);
        }
    }
    format!("{duration_ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Sizes: decimal by default, binary when spelled with "i", bare numbers are bytes.
    #[test]
    fn sizes_parse_decimal_and_binary() {
        assert_eq!(parse_size_bytes("500").unwrap(), 500);
        assert_eq!(parse_size_bytes("500B").unwrap(), 500);
        assert_eq!(parse_size_bytes("1KB").unwrap(), 1000);
        assert_eq!(parse_size_bytes("1KiB").unwrap(), 1024);
        assert_eq!(parse_size_bytes("20TB").unwrap(), 20_000_000_000_000);
        assert_eq!(parse_size_bytes("1TiB").unwrap(), 1_099_511_627_776);
        assert_eq!(parse_size_bytes("1.5 MB").unwrap(), 1_500_000);
        assert!(matches!(
            parse_size_bytes("5 furlongs"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_size_bytes(""), Err(UnitError::Empty { .. })));
        assert!(matches!(
            parse_size_bytes("x"),
            Err(UnitError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_size_bytes("99999999PB"),
            Err(UnitError::OutOfRange { .. })
        ));
    }

    // Durations need a unit; the seed's "7 days" is 604,800 s in every spelling.
    #[test]
    fn durations_parse_with_units_only() {
        assert_eq!(parse_duration_ms("7d").unwrap(), 604_800_000);
        assert_eq!(parse_duration_ms("604800s").unwrap(), 604_800_000);
        assert_eq!(parse_duration_ms("168h").unwrap(), 604_800_000);
        assert_eq!(parse_duration_ms("12h").unwrap(), 43_200_000);
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        assert!(parse_duration_ms("60").is_err());
        assert_eq!(format_duration_ms(604_800_000), "7d");
        assert_eq!(format_duration_ms(90_000), "90s");
    }

    // Bandwidth: bits per second for NICs, bytes per second when written with B/s.
    #[test]
    fn bandwidth_parses_bits_and_bytes() {
        assert_eq!(parse_bandwidth_bytes_per_s("10Gbps").unwrap(), 1.25e9);
        assert_eq!(parse_bandwidth_bytes_per_s("1.25GB/s").unwrap(), 1.25e9);
        assert!(parse_bandwidth_bytes_per_s("10GBps").is_err());
        assert!(parse_bandwidth_bytes_per_s("0Gbps").is_err());
    }

    // Printing is decimal and stable, so plan output can be compared in tests.
    #[test]
    fn formatting_is_decimal() {
        assert_eq!(format_bytes_decimal(302.4e12), "302.40 TB");
        assert_eq!(format_bytes_per_s_decimal(1.5e9), "1.50 GB/s");
        assert_eq!(format_bytes_decimal(500.0), "500 B");
        assert_eq!(format_thousands(1_000_000), "1,000,000");
        assert_eq!(format_thousands(999), "999");
    }
}
