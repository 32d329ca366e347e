//! Zig-zag variable-length integers as used inside record batch v2 records.
//! Decoders take untrusted bytes and return `None` on truncation or on input
//! longer than the type allows (more than 5 or 10 bytes, or bits past 32 or 64).

/// Largest encoding of a zig-zag i32 (5 bytes) and i64 (10 bytes).
pub const VARINT_BYTES_MAX: usize = 5;
pub const VARLONG_BYTES_MAX: usize = 10;

pub fn put_varint(out: &mut Vec<u8>, value: i32) {
    put_unsigned(out, ((value << 1) ^ (value >> 31)) as u32 as u64);
}

pub fn put_varlong(out: &mut Vec<u8>, value: i64) {
    put_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

fn put_unsigned(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Number of bytes `put_varint` writes for `value`.
pub fn varint_len(value: i32) -> usize {
    unsigned_len(((value << 1) ^ (value >> 31)) as u32 as u64)
}

pub fn varlong_len(value: i64) -> usize {
    unsigned_len(((value << 1) ^ (value >> 63)) as u64)
}

fn unsigned_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Decodes a zig-zag i32 from the front of `input`; returns it and the bytes consumed.
pub fn get_varint(input: &[u8]) -> Option<(i32, usize)> {
    let (raw, used) = get_unsigned(input, VARINT_BYTES_MAX, 32)?;
    let raw = raw as u32;
    Some((((raw >> 1) as i32) ^ -((raw & 1) as i32), used))
}

/// Decodes a zig-zag i64 from the front of `input`; returns it and the bytes consumed.
pub fn get_varlong(input: &[u8]) -> Option<(i64, usize)> {
    let (raw, used) = get_unsigned(input, VARLONG_BYTES_MAX, 64)?;
    Some((((raw >> 1) as i64) ^ -((raw & 1) as i64), used))
}

/// Decodes an unsigned LEB128 value of at most `bits` bits. Encodings that carry
/// bits past `bits` are refused, so every accepted input maps to one value.
fn get_unsigned(input: &[u8], bytes_max: usize, bits: u32) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    for (i, &byte) in input.iter().take(bytes_max).enumerate() {
        let shift = 7 * i as u32;
        let payload = u64::from(byte & 0x7f);
        if shift + 7 > bits && payload >> (bits - shift) != 0 {
            return None;
        }
        value |= payload << shift;
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varint_round_trips(v: i32) {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            prop_assert_eq!(buf.len(), varint_len(v));
            prop_assert_eq!(get_varint(&buf), Some((v, buf.len())));
        }

        #[test]
        fn varlong_round_trips(v: i64) {
            let mut buf = Vec::new();
            put_varlong(&mut buf, v);
            prop_assert_eq!(buf.len(), varlong_len(v));
            prop_assert_eq!(get_varlong(&buf), Some((v, buf.len())));
        }

        #[test]
        fn varint_decode_never_panics(bytes: Vec<u8>) {
            let _ = get_varint(&bytes);
            let _ = get_varlong(&bytes);
        }
    }

    #[test]
    fn known_encodings() {
        let mut buf = Vec::new();
        put_varint(&mut buf, -1);
        assert_eq!(buf, [0x01]);
        buf.clear();
        put_varint(&mut buf, 300);
        assert_eq!(buf, [0xd8, 0x04]);
        assert_eq!(
            get_varint(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01]),
            None,
            "overlong"
        );
        assert_eq!(get_varint(&[0x80]), None, "truncated");
        assert_eq!(
            get_varlong(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
            None,
            "bits past 64"
        );
        assert_eq!(
            get_varint(&[0xff, 0xff, 0xff, 0xff, 0x1f]),
            None,
            "bits past 32"
        );
        assert_eq!(
            get_varint(&[0xff, 0xff, 0xff, 0xff, 0x0f]),
            Some((i32::MIN, 5))
        );
    }
}
