//! On-disk framing shared by the Raft log, vote and snapshot files, and the
//! atomic whole-file write. Owns byte layout and fsync discipline; knows nothing
//! of what the framed bodies mean.
//!
//! A file is an 8-byte magic followed by frames:
//!
//! ```text
//! frame := body_length: u32 LE | crc32c(body): u32 LE | body: [u8; body_length]
//! ```
//!
//! Frames are appended and fsynced (`sync_data`) before the write is reported
//! durable. A crash can leave the last frame torn (short, or with a bad CRC);
//! `scan` stops at the first frame that does not check out and reports its start,
//! where the log file is then truncated.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::store::error::StoreError;

pub const FRAME_HEADER_BYTES: usize = 8;
pub const MAGIC_BYTES: usize = 8;
/// Bound on one frame's body, checked before allocating or trusting a length.
pub const FRAME_BODY_BYTES_MAX: usize = 1 << 30;

/// Appends one frame around `body` to `out`.
pub fn encode(body: &[u8], out: &mut Vec<u8>) {
    assert!(
        body.len() <= FRAME_BODY_BYTES_MAX,
        "frame body too large: {} bytes",
        body.len()
    );
    let length = u32::try_from(body.len()).expect("bounded by FRAME_BODY_BYTES_MAX");
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
}

/// The valid frames found by `scan`, and where the valid prefix ends.
#[derive(Debug)]
pub struct Scan<'a> {
    pub bodies: Vec<&'a [u8]>,
    /// Byte offset (within the scanned slice) just after the last valid frame.
    pub valid_bytes: usize,
}

/// Splits `bytes` into frames, stopping at the first incomplete or corrupt one.
pub fn scan(bytes: &[u8]) -> Scan<'_> {
    let mut bodies = Vec::new();
    let mut at = 0;
    while let Some((body, next)) = frame_at(bytes, at) {
        bodies.push(body);
        at = next;
    }
    Scan {
        bodies,
        valid_bytes: at,
    }
}

fn frame_at(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let header = bytes.get(at..at.checked_add(FRAME_HEADER_BYTES)?)?;
    let length = u32::from_le_bytes(header[0..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if length > FRAME_BODY_BYTES_MAX {
        return None;
    }
    let start = at + FRAME_HEADER_BYTES;
    let body = bytes.get(start..start.checked_add(length)?)?;
    (crc32c::crc32c(body) == crc).then_some((body, start + length))
}

/// Writes `magic` and one frame per body to `path` so that a crash leaves either
/// the old file or the complete new one: write a temporary file, fsync it, rename
/// it over `path`, fsync the directory.
pub fn write_atomically(
    path: &Path,
    magic: &[u8; MAGIC_BYTES],
    bodies: &[&[u8]],
) -> Result<(), StoreError> {
    let mut bytes = magic.to_vec();
    for body in bodies {
        encode(body, &mut bytes);
    }
    let tmp = path.with_extension("tmp");
    let written = File::create(&tmp)
        .map_err(StoreError::io("create", &tmp))
        .and_then(|mut file| {
            file.write_all(&bytes)
                .map_err(StoreError::io("write", &tmp))?;
            file.sync_all().map_err(StoreError::io("fsync", &tmp))
        });
    if let Err(e) = written {
        // The file in place is untouched; a half-written replacement would
        // only hold on to space a full disk needs back.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("rename", path)(e));
    }
    // The new file is in place: a refusal from here on is no write to try
    // again (the caller would take the old file for the one standing).
    sync_parent_dir(path).map_err(StoreError::settled)
}

/// Reads a file written by `write_atomically`; `None` if it does not exist. Since
/// the file is replaced atomically, any damage is corruption, not a torn write.
pub fn read_whole(
    path: &Path,
    magic: &[u8; MAGIC_BYTES],
    frame_count: usize,
) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("read", path)(e)),
    };
    if bytes.get(..MAGIC_BYTES) != Some(magic.as_slice()) {
        return Err(StoreError::corrupt(path, "bad magic"));
    }
    let scan = scan(&bytes[MAGIC_BYTES..]);
    if scan.bodies.len() != frame_count || MAGIC_BYTES + scan.valid_bytes != bytes.len() {
        return Err(StoreError::corrupt(path, "bad frame"));
    }
    Ok(Some(scan.bodies.into_iter().map(<[u8]>::to_vec).collect()))
}

pub fn sync_parent_dir(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let handle = OpenOptions::new()
        .read(true)
        .open(dir)
        .map_err(StoreError::io("open dir", dir))?;
    handle.sync_all().map_err(StoreError::io("fsync dir", dir))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        // Every prefix of a framed stream scans to the frames wholly inside it, and a
        // flipped byte ends the scan at or before the damaged frame.
        #[test]
        fn scan_stops_at_torn_or_corrupt_frame(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8),
            cut_seed in any::<usize>(),
            flip_seed in any::<usize>(),
        ) {
            let mut bytes = Vec::new();
            let mut ends = Vec::new();
            for b in &bodies {
                encode(b, &mut bytes);
                ends.push(bytes.len());
            }
            let cut = cut_seed % (bytes.len() + 1);
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            let scanned = scan(&bytes[..cut]);
            prop_assert_eq!(scanned.bodies.len(), whole);
            prop_assert_eq!(scanned.valid_bytes, if whole == 0 { 0 } else { ends[whole - 1] });

            if !bytes.is_empty() {
                let flip = flip_seed % bytes.len();
                let mut damaged = bytes.clone();
                damaged[flip] ^= 0x5a;
                let damaged_frame = ends.iter().filter(|&&e| e <= flip).count();
                let scanned = scan(&damaged);
                prop_assert!(scanned.bodies.len() <= damaged_frame);
                for (got, want) in scanned.bodies.iter().zip(&bodies) {
                    prop_assert_eq!(*got, want.as_slice());
                }
            }
        }
    }
}
