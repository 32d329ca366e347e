//! Message values for `--payload random|json`, exactly `--message-size`
//! bytes, each stamped with a header that carries the message's `ValueId`
//! and its send time so consumers can measure end-to-end latency and the
//! verifier can match reads to acknowledgements. Bodies come from a pool
//! generated once at start-up; per message only the header is rewritten.
//!
//! Header formats (fixed offsets, so decoding never parses the body):
//! - `random`: bytes 0..8 value id (u64 big-endian), bytes 8..16 send time
//!   in microseconds since the Unix epoch (u64 big-endian), then random
//!   (incompressible) bytes. Minimum size 16.
//! - `json`: the value starts `{"lg":"IIIIIIIIIIIIIIIITTTTTTTTTTTTTTTT"`
//!   (40 bytes: 16 lowercase hex digits of the value id, then 16 of the send
//!   time in µs) followed by `}` or `,` and more fields of a realistic
//!   order event, padded with a text `note` field (or spaces) to the exact
//!   size. Every value is valid JSON. Minimum size 41.

use std::fmt::Write as _;
use std::str::FromStr;

use thiserror::Error;

use crate::value_id::ValueId;

/// Bound on `--message-size`.
pub const MESSAGE_SIZE_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Bound on the memory of the body pool, whatever the message size.
pub const POOL_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Bodies in the pool when they fit under `POOL_BYTES_MAX`.
pub const POOL_ENTRIES_MAX: usize = 256;
pub const RANDOM_HEADER_BYTES: usize = 16;
pub const JSON_HEADER_BYTES: usize = 40;
const JSON_PREFIX: &[u8] = b"{\"lg\":\"";

/// Why a payload could not be made or read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PayloadError {
    #[error("--payload {0:?}: expected random or json")]
    Kind(String),
    #[error("--message-size {size_bytes}: {kind} payloads need {min_bytes}..={MESSAGE_SIZE_BYTES_MAX} bytes")]
    Size {
        kind: PayloadKind,
        size_bytes: u64,
        min_bytes: u64,
    },
    #[error("value of {len_bytes} bytes does not start with a {kind} payload header")]
    Header { kind: PayloadKind, len_bytes: usize },
}

/// The `--payload` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    Random,
    Json,
}

impl PayloadKind {
    pub fn min_size_bytes(self) -> u64 {
        match self {
            PayloadKind::Random => RANDOM_HEADER_BYTES as u64,
            PayloadKind::Json => JSON_HEADER_BYTES as u64 + 1,
        }
    }
}

impl FromStr for PayloadKind {
    type Err = PayloadError;

    fn from_str(input: &str) -> Result<PayloadKind, PayloadError> {
        match input {
            "random" => Ok(PayloadKind::Random),
            "json" => Ok(PayloadKind::Json),
            _ => Err(PayloadError::Kind(input.to_string())),
        }
    }
}

impl std::fmt::Display for PayloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PayloadKind::Random => "random",
            PayloadKind::Json => "json",
        })
    }
}

/// What the header carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadHeader {
    pub value_id: ValueId,
    /// Wall-clock send time, microseconds since the Unix epoch.
    pub send_time_us: u64,
}

/// Rewrites the header of `value` in place.
pub fn stamp_header(kind: PayloadKind, value: &mut [u8], header: PayloadHeader) {
    assert!(
        value.len() as u64 >= kind.min_size_bytes(),
        "value shorter than its header"
    );
    match kind {
        PayloadKind::Random => {
            value[0..8].copy_from_slice(&header.value_id.0.to_be_bytes());
            value[8..16].copy_from_slice(&header.send_time_us.to_be_bytes());
        }
        PayloadKind::Json => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let start = JSON_PREFIX.len();
            for (field_index, field) in [header.value_id.0, header.send_time_us]
                .into_iter()
                .enumerate()
            {
                for nibble_index in 0..16 {
                    let nibble = (field >> (60 - 4 * nibble_index)) & 0xF;
                    value[start + field_index * 16 + nibble_index] = HEX[nibble as usize];
                }
            }
        }
    }
}

/// Reads the header back from a consumed value.
pub fn decode_header(kind: PayloadKind, value: &[u8]) -> Result<PayloadHeader, PayloadError> {
    let bad = || PayloadError::Header {
        kind,
        len_bytes: value.len(),
    };
    if (value.len() as u64) < kind.min_size_bytes() {
        return Err(bad());
    }
    match kind {
        PayloadKind::Random => Ok(PayloadHeader {
            value_id: ValueId(u64::from_be_bytes(value[0..8].try_into().expect("8 bytes"))),
            send_time_us: u64::from_be_bytes(value[8..16].try_into().expect("8 bytes")),
        }),
        PayloadKind::Json => {
            let start = JSON_PREFIX.len();
            if !value.starts_with(JSON_PREFIX) || value[start + 32] != b'"' {
                return Err(bad());
            }
            let hex = |range: std::ops::Range<usize>| -> Result<u64, PayloadError> {
                let text = std::str::from_utf8(&value[range]).map_err(|_| bad())?;
                u64::from_str_radix(text, 16).map_err(|_| bad())
            };
            Ok(PayloadHeader {
                value_id: ValueId(hex(start..start + 16)?),
                send_time_us: hex(start + 16..start + 32)?,
            })
        }
    }
}

/// Produces stamped values of one kind and size.
#[derive(Debug, Clone)]
pub struct PayloadGenerator {
    kind: PayloadKind,
    size_bytes: usize,
    pool: Vec<Vec<u8>>,
    rng: fastrand::Rng,
}

impl PayloadGenerator {
    /// Builds the body pool (bounded by `POOL_BYTES_MAX`) from `seed`.
    pub fn new(
        kind: PayloadKind,
        size_bytes: u64,
        seed: u64,
    ) -> Result<PayloadGenerator, PayloadError> {
        let min_bytes = kind.min_size_bytes();
        if size_bytes < min_bytes || size_bytes > MESSAGE_SIZE_BYTES_MAX {
            return Err(PayloadError::Size {
                kind,
                size_bytes,
                min_bytes,
            });
        }
        let size = usize::try_from(size_bytes).expect("bounded by MESSAGE_SIZE_BYTES_MAX");
        let entries = (POOL_BYTES_MAX / size_bytes).clamp(1, POOL_ENTRIES_MAX as u64) as usize;
        let mut rng = fastrand::Rng::with_seed(seed);
        let pool: Vec<Vec<u8>> = (0..entries)
            .map(|_| match kind {
                PayloadKind::Random => random_body(&mut rng, size),
                PayloadKind::Json => json_body(&mut rng, size),
            })
            .collect();
        assert!(pool.iter().all(|body| body.len() == size));
        Ok(PayloadGenerator {
            kind,
            size_bytes: size,
            pool,
            rng,
        })
    }

    pub fn kind(&self) -> PayloadKind {
        self.kind
    }

    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// Appends a stamped value of `size_bytes` to `out`, where it will stay
    /// (a record batch being built).
    pub fn append_payload(&mut self, header: PayloadHeader, out: &mut Vec<u8>) {
        let body = &self.pool[self.rng.usize(0..self.pool.len())];
        let start = out.len();
        out.extend_from_slice(body);
        stamp_header(self.kind, &mut out[start..], header);
    }

    /// A freshly allocated stamped value.
    pub fn next_payload(&mut self, header: PayloadHeader) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size_bytes);
        self.append_payload(header, &mut out);
        out
    }
}

fn random_body(rng: &mut fastrand::Rng, size: usize) -> Vec<u8> {
    let mut body = vec![0u8; size];
    rng.fill(&mut body);
    body
}

const CITIES: [(&str, &str); 6] = [
    ("Lyon", "FR"),
    ("Berlin", "DE"),
    ("Porto", "PT"),
    ("Utrecht", "NL"),
    ("Bologna", "IT"),
    ("Leeds", "GB"),
];
const WORDS: [&str; 16] = [
    "please",
    "leave",
    "parcel",
    "with",
    "neighbour",
    "gift",
    "wrap",
    "fragile",
    "deliver",
    "after",
    "noon",
    "ring",
    "bell",
    "twice",
    "thank",
    "you",
];

/// One realistic order event split into `,"field":value` pieces, so the
/// body can drop pieces that do not fit rather than cut JSON mid-token.
fn json_fields(rng: &mut fastrand::Rng) -> Vec<String> {
    let events = [
        "order_created",
        "order_paid",
        "order_shipped",
        "order_cancelled",
    ];
    let (city, country) = CITIES[rng.usize(0..CITIES.len())];
    let mut items = String::from("[");
    let mut amount_cents = 0u64;
    for item_index in 0..rng.usize(1..=4) {
        let quantity = rng.u64(1..=5);
        let unit_price_cents = rng.u64(199..=19_999);
        amount_cents += quantity * unit_price_cents;
        if item_index > 0 {
            items.push(',');
        }
        let _ = write!(
            items,
            "{{\"sku\":\"SKU-{:05}\",\"qty\":{quantity},\"unit_price_cents\":{unit_price_cents}}}",
            rng.u32(0..100_000)
        );
    }
    items.push(']');
    vec![
        format!(",\"type\":\"{}\"", events[rng.usize(0..events.len())]),
        format!(",\"order_id\":\"ord_{:010}\"", rng.u64(0..10_000_000_000)),
        format!(",\"customer_id\":\"cus_{:08}\"", rng.u32(0..100_000_000)),
        format!(
            ",\"created_at\":\"2025-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z\"",
            rng.u8(1..=12),
            rng.u8(1..=28),
            rng.u8(0..24),
            rng.u8(0..60),
            rng.u8(0..60),
            rng.u16(0..1000)
        ),
        format!(",\"currency\":\"{}\"", if country == "GB" { "GBP" } else { "EUR" }),
        format!(",\"amount_cents\":{amount_cents}"),
        format!(",\"items\":{items}"),
        format!(",\"shipping\":{{\"city\":\"{city}\",\"country\":\"{country}\",\"postcode\":\"{:05}\"}}", rng.u32(0..100_000)),
        format!(",\"channel\":\"{}\"", ["web", "ios", "android", "store"][rng.usize(0..4)]),
    ]
}

fn json_body(rng: &mut fastrand::Rng, size: usize) -> Vec<u8> {
    const NOTE_OVERHEAD_BYTES: usize = ",\"note\":\"\"".len();
    // Header with a zero id and time; stamped per message.
    let mut body = String::with_capacity(size);
    body.push_str("{\"lg\":\"");
    body.push_str(&"0".repeat(32));
    body.push('"');
    assert_eq!(body.len(), JSON_HEADER_BYTES);
    for field in json_fields(rng) {
        // Keep one byte for the closing brace.
        if body.len() + field.len() < size {
            body.push_str(&field);
        }
    }
    let remaining = size - body.len() - 1;
    if remaining >= NOTE_OVERHEAD_BYTES {
        let mut note = String::with_capacity(remaining);
        while note.len() < remaining - NOTE_OVERHEAD_BYTES {
            if !note.is_empty() {
                note.push(' ');
            }
            note.push_str(WORDS[rng.usize(0..WORDS.len())]);
        }
        note.truncate(remaining - NOTE_OVERHEAD_BYTES);
        body.push_str(",\"note\":\"");
        body.push_str(&note);
        body.push('"');
    } else {
        // JSON allows whitespace between tokens: pads of a few bytes.
        body.push_str(&" ".repeat(remaining));
    }
    body.push('}');
    assert_eq!(
        body.len(),
        size,
        "json body must be exactly the message size"
    );
    body.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(sequence: u64) -> PayloadHeader {
        PayloadHeader {
            value_id: ValueId::new(7, sequence),
            send_time_us: 1_700_000_000_123_456 + sequence,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        // Every size from the minimum up gives exactly that many bytes, valid
        // JSON for json, and a header that decodes back.
        #[test]
        fn exact_size_and_header_round_trip(size in 41u64..3_000, seed in any::<u64>(), sequence in 0u64..1_000_000) {
            for kind in [PayloadKind::Random, PayloadKind::Json] {
                let mut generator = PayloadGenerator::new(kind, size, seed).unwrap();
                let value = generator.next_payload(header(sequence));
                prop_assert_eq!(value.len() as u64, size);
                prop_assert_eq!(decode_header(kind, &value).unwrap(), header(sequence));
                if kind == PayloadKind::Json {
                    let parsed: serde_json::Value = serde_json::from_slice(&value).unwrap();
                    prop_assert!(parsed["lg"].as_str().unwrap().len() == 32);
                }
            }
        }
    }

    // A value appended behind other bytes is stamped where it lands and
    // leaves the bytes before it alone.
    #[test]
    fn an_appended_value_is_stamped_in_place() {
        for kind in [PayloadKind::Random, PayloadKind::Json] {
            let mut generator = PayloadGenerator::new(kind, 500, 3).unwrap();
            let mut out = b"prefix".to_vec();
            generator.append_payload(header(5), &mut out);
            assert_eq!(out.len(), 6 + 500);
            assert_eq!(&out[..6], b"prefix");
            assert_eq!(decode_header(kind, &out[6..]).unwrap(), header(5));
        }
    }

    // The smallest sizes work; smaller ones are refused with the minimum named.
    #[test]
    fn minimum_sizes() {
        let mut json = PayloadGenerator::new(PayloadKind::Json, 41, 1).unwrap();
        let value = json.next_payload(header(1));
        assert_eq!(value.len(), 41);
        serde_json::from_slice::<serde_json::Value>(&value).unwrap();
        assert!(PayloadGenerator::new(PayloadKind::Random, 16, 1).is_ok());
        let error = PayloadGenerator::new(PayloadKind::Json, 40, 1).unwrap_err();
        assert!(error.to_string().contains("41..="));
        assert!(PayloadGenerator::new(PayloadKind::Random, MESSAGE_SIZE_BYTES_MAX + 1, 1).is_err());
    }

    // A 500 B json event looks like an order (fields present, not just padding).
    #[test]
    fn json_event_is_realistic() {
        let mut generator = PayloadGenerator::new(PayloadKind::Json, 500, 3).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(&generator.next_payload(header(0))).unwrap();
        for field in [
            "type",
            "order_id",
            "customer_id",
            "created_at",
            "amount_cents",
            "items",
            "shipping",
        ] {
            assert!(value.get(field).is_some(), "{field} missing in {value}");
        }
    }

    // Same seed, same bytes; the pool is bounded for large messages.
    #[test]
    fn deterministic_and_bounded() {
        for kind in [PayloadKind::Random, PayloadKind::Json] {
            let mut a = PayloadGenerator::new(kind, 500, 9).unwrap();
            let mut b = PayloadGenerator::new(kind, 500, 9).unwrap();
            for sequence in 0..50 {
                assert_eq!(
                    a.next_payload(header(sequence)),
                    b.next_payload(header(sequence))
                );
            }
        }
        let big = PayloadGenerator::new(PayloadKind::Random, MESSAGE_SIZE_BYTES_MAX, 1).unwrap();
        assert!(big.pool.len() as u64 * MESSAGE_SIZE_BYTES_MAX <= POOL_BYTES_MAX);
        assert_eq!(
            PayloadGenerator::new(PayloadKind::Json, 500, 1)
                .unwrap()
                .pool
                .len(),
            POOL_ENTRIES_MAX
        );
    }

    // Garbage is reported, not misread.
    #[test]
    fn decode_rejects_garbage() {
        assert!(decode_header(PayloadKind::Random, &[0u8; 15]).is_err());
        assert!(decode_header(PayloadKind::Json, &[b'x'; 64]).is_err());
        let mut value = PayloadGenerator::new(PayloadKind::Json, 64, 1)
            .unwrap()
            .next_payload(header(1));
        value[10] = b'z';
        assert!(decode_header(PayloadKind::Json, &value).is_err());
        assert_eq!("json".parse::<PayloadKind>().unwrap(), PayloadKind::Json);
        assert!("xml".parse::<PayloadKind>().is_err());
    }
}
