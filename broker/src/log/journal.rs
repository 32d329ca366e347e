//! The on-disk form of a shard's journal ring and the sans-IO writer and
//! reader of it: record encoding, where each round of records goes, how much
//! room is left, the header that says where the live records start, and the
//! scan that finds them again after a crash.
//!
//! Why a ring: under `flush.policy=always` a shard syncs each log on its own,
//! one round of write, `fdatasync`, metadata and flush per log per commit.
//! One journal per shard, zeroed once and then only overwritten, takes every
//! log's commit in one direct write that needs no metadata
//! (docs/performance.md, "A shard-wide journal, measured before building
//! it"). This module is the format only; `shard_journal` writes the ring
//! and `journal_replay` reads it back at start.
//!
//! Layout: the first [`JOURNAL_BLOCK_BYTES`] hold the header, twice (one copy
//! per 512-byte sector, the newer generation wins, so a torn header write
//! leaves the older copy). Records follow, packed back to back within a
//! round; each round starts on a block boundary, at the head, or at the
//! start of the record area when it does not fit before the ring's end.
//! Every record carries a sequence number one above the one before it, the
//! ring's id and a CRC-32C over all of it, so a scan from the header's start
//! accepts exactly the records written since: a torn round, or a record left
//! over from an earlier lap, ends it. The id is random, never leaves the
//! file, and changes whenever a ring is made or resumed after a start: a
//! record-shaped block inside a chunk (producers' bytes) cannot pass for a
//! record, and nothing written before a start can be read as written after
//! it, however a torn round's sectors landed.

use protocol::Offset;

/// The unit of every journal write: rounds start on it and are padded to it.
pub const JOURNAL_BLOCK_BYTES: u64 = 4096;
pub const RECORD_HEADER_BYTES: usize = 48;
/// A log's directory name as a record carries it.
pub const JOURNAL_LOG_NAME_BYTES_MAX: usize = 255;
/// The largest chunk image one record carries (a tail chunk is at most 1 MiB).
pub const JOURNAL_CHUNK_BYTES_MAX: usize = 16 << 20;
/// The smallest ring: a header block and room for a few rounds.
pub const JOURNAL_RING_BYTES_MIN: u64 = 16 * JOURNAL_BLOCK_BYTES;

const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RLJR");
const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"RLJH");
const HEADER_VERSION: u32 = 1;
const HEADER_SLOT_BYTES: usize = 512;
const HEADER_BYTES: usize = 56;
/// Sequence numbers and generations stay far below where adding to them
/// could overflow; a header claiming more is damaged.
const COUNTER_MAX: u64 = u64::MAX / 2;
const KIND_WRITE: u8 = 1;
const KIND_FENCE: u8 = 2;
const KIND_SEGMENT_FENCE: u8 = 3;

/// A record's place in the journal's history: one above the record before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct JournalSeq(pub u64);

/// What a record asks replay to do for its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordBody<'a> {
    /// Write `bytes` (a chunk image, block-aligned) at `position` of the
    /// segment file whose base is `segment_base`.
    Write {
        segment_base: Offset,
        position: u64,
        bytes: &'a [u8],
    },
    /// Everything journaled for the log before this record is in its files
    /// already, or must never be written again (a truncation, a swap, a
    /// removal): replay skips it.
    Fence,
    /// As `Fence`, for one segment of the log only: its file was replaced
    /// by one of other bytes (a compaction swap), so nothing journaled for
    /// it before may be written into it. The log's other segments keep
    /// their records.
    SegmentFence { segment_base: Offset },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub seq: JournalSeq,
    /// The log's directory name (one path component).
    pub log: &'a str,
    pub body: RecordBody<'a>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JournalError {
    #[error("journal ring of {ring_bytes} bytes: must be a multiple of {JOURNAL_BLOCK_BYTES} and at least {JOURNAL_RING_BYTES_MIN}")]
    RingSize { ring_bytes: u64 },
    #[error("a round of {round_bytes} bytes does not fit a ring of {ring_bytes} bytes")]
    RoundTooLarge { round_bytes: u64, ring_bytes: u64 },
    #[error("journal full: a round needs {needed_bytes} bytes, {free_bytes} are free until a checkpoint")]
    Full { needed_bytes: u64, free_bytes: u64 },
    #[error("journal log name {name:?} is not one path component of at most {JOURNAL_LOG_NAME_BYTES_MAX} bytes")]
    LogName { name: String },
    #[error("journal chunk of {len} bytes at {position}: must be block-aligned and at most {JOURNAL_CHUNK_BYTES_MAX} bytes")]
    Chunk { position: u64, len: usize },
    #[error("journal header: {reason}")]
    Header { reason: &'static str },
}

/// Where the live records start (or the next one goes) and its sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPosition {
    pub position: u64,
    pub seq: JournalSeq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalHeader {
    pub generation: u64,
    pub ring_bytes: u64,
    pub start: RingPosition,
    /// Every live record carries it.
    pub ring_id: u64,
}

/// The little-endian integer at `at` of bytes already checked to hold it.
fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn check_ring_bytes(ring_bytes: u64) -> Result<(), JournalError> {
    if ring_bytes < JOURNAL_RING_BYTES_MIN || !ring_bytes.is_multiple_of(JOURNAL_BLOCK_BYTES) {
        return Err(JournalError::RingSize { ring_bytes });
    }
    Ok(())
}

fn check_log_name(log: &str) -> Result<(), JournalError> {
    let ok = !log.is_empty()
        && log.len() <= JOURNAL_LOG_NAME_BYTES_MAX
        && log != "."
        && log != ".."
        && !log.contains(['/', '\0']);
    if ok {
        Ok(())
    } else {
        Err(JournalError::LogName {
            name: log.to_owned(),
        })
    }
}

fn check_chunk(position: u64, len: usize) -> Result<(), JournalError> {
    let ok = len <= JOURNAL_CHUNK_BYTES_MAX
        && position.is_multiple_of(JOURNAL_BLOCK_BYTES)
        && (len as u64).is_multiple_of(JOURNAL_BLOCK_BYTES);
    if ok {
        Ok(())
    } else {
        Err(JournalError::Chunk { position, len })
    }
}

impl JournalHeader {
    fn encode_slot(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        out[8..12].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        out[16..24].copy_from_slice(&self.generation.to_le_bytes());
        out[24..32].copy_from_slice(&self.ring_bytes.to_le_bytes());
        out[32..40].copy_from_slice(&self.start.position.to_le_bytes());
        out[40..48].copy_from_slice(&self.start.seq.0.to_le_bytes());
        out[48..56].copy_from_slice(&self.ring_id.to_le_bytes());
        let crc = crc32c::crc32c(&out[8..]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn decode_slot(slot: &[u8]) -> Option<JournalHeader> {
        let word = |at: usize| le_u64(slot, at);
        let (magic, crc, version) = (le_u32(slot, 0), le_u32(slot, 4), le_u32(slot, 8));
        if magic != HEADER_MAGIC
            || crc != crc32c::crc32c(&slot[8..HEADER_BYTES])
            || version != HEADER_VERSION
        {
            return None;
        }
        let header = JournalHeader {
            generation: word(16),
            ring_bytes: word(24),
            start: RingPosition {
                position: word(32),
                seq: JournalSeq(word(40)),
            },
            ring_id: word(48),
        };
        let start = header.start.position;
        let valid = check_ring_bytes(header.ring_bytes).is_ok()
            && header.generation < COUNTER_MAX
            && header.start.seq.0 < COUNTER_MAX
            && start >= JOURNAL_BLOCK_BYTES
            && start < header.ring_bytes
            && start.is_multiple_of(JOURNAL_BLOCK_BYTES);
        valid.then_some(header)
    }

    /// The header block with this header in its generation's slot and
    /// `previous` (the header it replaces) left in the other, so a torn write
    /// of the block leaves at least one of them whole.
    pub fn encode_block(&self, previous: Option<&JournalHeader>) -> Vec<u8> {
        let mut block = vec![0u8; JOURNAL_BLOCK_BYTES as usize];
        let slot_of = |h: &JournalHeader| (h.generation % 2) as usize * HEADER_SLOT_BYTES;
        if let Some(previous) = previous {
            assert_eq!(
                previous.generation + 1,
                self.generation,
                "headers replace their predecessor"
            );
            let at = slot_of(previous);
            block[at..at + HEADER_BYTES].copy_from_slice(&previous.encode_slot());
        }
        let at = slot_of(self);
        block[at..at + HEADER_BYTES].copy_from_slice(&self.encode_slot());
        block
    }

    /// The newest whole header of a header block.
    pub fn decode_block(block: &[u8]) -> Result<JournalHeader, JournalError> {
        if block.len() < 2 * HEADER_SLOT_BYTES {
            return Err(JournalError::Header {
                reason: "shorter than its two slots",
            });
        }
        (0..2)
            .filter_map(|i| {
                let at = i * HEADER_SLOT_BYTES;
                JournalHeader::decode_slot(&block[at..at + HEADER_BYTES])
            })
            .max_by_key(|h| h.generation)
            .ok_or(JournalError::Header {
                reason: "no slot holds a whole header",
            })
    }
}

/// Where the record after one that ended at `at` may begin, and so the
/// only places a scan looks: right there, at the next block (a new round),
/// or at the start of the record area (a round that wrapped). The first
/// record's `at` is the header's start. A reader that fetches only part of
/// a ring fetches these.
pub fn record_candidates(at: u64) -> [u64; 3] {
    [
        at,
        at.next_multiple_of(JOURNAL_BLOCK_BYTES),
        JOURNAL_BLOCK_BYTES,
    ]
}

/// Whether a record may begin at the start of `block` (its magic is there):
/// a block that fails this holds no record start, whatever its bytes.
pub fn may_start_record(block: &[u8]) -> bool {
    block.get(..4) == Some(&RECORD_MAGIC.to_le_bytes()[..])
}

/// A record to be written, before it has a sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordSpec<'a> {
    pub log: &'a str,
    pub body: RecordBody<'a>,
}

impl<'a> RecordSpec<'a> {
    /// A chunk image of `log`'s segment `segment_base` at `position`.
    pub fn write(log: &'a str, segment_base: Offset, position: u64, bytes: &'a [u8]) -> Self {
        RecordSpec {
            log,
            body: RecordBody::Write {
                segment_base,
                position,
                bytes,
            },
        }
    }

    pub fn fence(log: &'a str) -> Self {
        RecordSpec {
            log,
            body: RecordBody::Fence,
        }
    }

    pub fn segment_fence(log: &'a str, segment_base: Offset) -> Self {
        RecordSpec {
            log,
            body: RecordBody::SegmentFence { segment_base },
        }
    }
}

impl RecordSpec<'_> {
    fn encoded_bytes(&self) -> usize {
        let payload = match self.body {
            RecordBody::Write { bytes, .. } => bytes.len(),
            RecordBody::Fence | RecordBody::SegmentFence { .. } => 0,
        };
        RECORD_HEADER_BYTES + self.log.len() + payload
    }

    fn check(&self) -> Result<(), JournalError> {
        check_log_name(self.log)?;
        if let RecordBody::Write {
            position, bytes, ..
        } = self.body
        {
            check_chunk(position, bytes.len())?;
        }
        Ok(())
    }

    /// Writes the record at `out[at..]` (which has room for it); returns
    /// where it ends.
    fn encode_at(&self, seq: JournalSeq, ring_id: u64, out: &mut [u8], at: usize) -> usize {
        let (kind, base, position, bytes): (u8, i64, u64, &[u8]) = match self.body {
            RecordBody::Write {
                segment_base,
                position,
                bytes,
            } => (KIND_WRITE, segment_base.0, position, bytes),
            RecordBody::Fence => (KIND_FENCE, 0, 0, &[]),
            RecordBody::SegmentFence { segment_base } => {
                (KIND_SEGMENT_FENCE, segment_base.0, 0, &[])
            }
        };
        let end = at + self.encoded_bytes();
        let record = &mut out[at..end];
        record[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        record[8..16].copy_from_slice(&seq.0.to_le_bytes());
        record[16] = kind;
        record[17] = 0;
        record[18..20].copy_from_slice(&(self.log.len() as u16).to_le_bytes());
        record[20..24].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        record[24..32].copy_from_slice(&base.to_le_bytes());
        record[32..40].copy_from_slice(&position.to_le_bytes());
        record[40..48].copy_from_slice(&ring_id.to_le_bytes());
        let name_end = RECORD_HEADER_BYTES + self.log.len();
        record[RECORD_HEADER_BYTES..name_end].copy_from_slice(self.log.as_bytes());
        record[name_end..].copy_from_slice(bytes);
        let crc = crc32c::crc32c(&record[8..]);
        record[4..8].copy_from_slice(&crc.to_le_bytes());
        end
    }
}

/// What a round is encoded into, in place: a plain vector, or the I/O
/// layer's aligned buffer that the ring file is written from (so a chunk's
/// bytes are copied once, into the round).
pub trait RoundBuffer {
    /// A buffer of `len` bytes, of any content.
    fn with_len(len: usize) -> Self;
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl RoundBuffer for Vec<u8> {
    fn with_len(len: usize) -> Self {
        vec![0; len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// One write of the ring: `bytes` (block-padded) at `position`.
#[derive(Debug, PartialEq, Eq)]
pub struct RoundWrite<B = Vec<u8>> {
    pub position: u64,
    pub bytes: B,
    /// The sequence numbers the round's records got, first to last.
    pub first_seq: JournalSeq,
    pub records: usize,
}

/// A point in the written history: what a checkpoint releases up to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingMark {
    head: RingPosition,
    written_bytes: u64,
}

/// The writer's side of the ring, without I/O: where the next round goes,
/// which sequence numbers it gets, and how much room is left before the
/// oldest record still needed (the header's start). A checkpoint
/// ([`release_to`](Self::release_to)) moves the start once every record
/// before a [`mark`](Self::mark) is in its segment files.
#[derive(Debug)]
pub struct RingWriter {
    header: JournalHeader,
    head: RingPosition,
    /// Bytes the rounds took since the ring began, gaps at its end included.
    written_bytes: u64,
    /// `written_bytes` where the header's start is.
    start_written_bytes: u64,
}

impl RingWriter {
    /// A ring with nothing live, its first record numbered `first_seq`, its
    /// records carrying `ring_id` (random: see the module's comment).
    pub fn new(
        ring_bytes: u64,
        first_seq: JournalSeq,
        ring_id: u64,
    ) -> Result<RingWriter, JournalError> {
        check_ring_bytes(ring_bytes)?;
        let start = RingPosition {
            position: JOURNAL_BLOCK_BYTES,
            seq: first_seq,
        };
        Ok(RingWriter {
            header: JournalHeader {
                generation: 0,
                ring_bytes,
                start,
                ring_id,
            },
            head: start,
            written_bytes: 0,
            start_written_bytes: 0,
        })
    }

    /// A writer that goes on after `scan` of an existing ring whose records
    /// are all replayed: nothing is live, the next round goes after them,
    /// and its records carry `ring_id` (a new random id). Returns the header
    /// block that says so, which must be written durably before any round:
    /// until then a crash finds the old header and replays the same records
    /// again, into files nothing has changed since.
    pub fn resume(scan: &Scan<'_>, ring_id: u64) -> (RingWriter, Vec<u8>) {
        let head = if scan.next.position >= scan.header.ring_bytes {
            RingPosition {
                position: JOURNAL_BLOCK_BYTES,
                seq: scan.next.seq,
            }
        } else {
            scan.next
        };
        let mut writer = RingWriter {
            header: scan.header,
            head,
            written_bytes: 0,
            start_written_bytes: 0,
        };
        let block = writer.release_with_id(writer.mark(), ring_id);
        (writer, block)
    }

    pub fn header(&self) -> JournalHeader {
        self.header
    }

    pub fn head(&self) -> RingPosition {
        self.head
    }

    fn area_bytes(&self) -> u64 {
        self.header.ring_bytes - JOURNAL_BLOCK_BYTES
    }

    /// Bytes a round may still take before a checkpoint must release some.
    pub fn free_bytes(&self) -> u64 {
        self.area_bytes() - (self.written_bytes - self.start_written_bytes)
    }

    /// Whether the format takes every one of `records` (names, chunk sizes
    /// and alignment), before any room is asked for.
    pub fn check_records(records: &[RecordSpec<'_>]) -> Result<(), JournalError> {
        records.iter().try_for_each(RecordSpec::check)
    }

    /// Encodes `records` as the next round. Nothing changes on an error.
    pub fn round(&mut self, records: &[RecordSpec<'_>]) -> Result<RoundWrite, JournalError> {
        self.round_in(records)
    }

    /// As [`round`](Self::round), encoded into a buffer of type `B`.
    pub fn round_in<B: RoundBuffer>(
        &mut self,
        records: &[RecordSpec<'_>],
    ) -> Result<RoundWrite<B>, JournalError> {
        Self::check_records(records)?;
        let encoded: usize = records.iter().map(RecordSpec::encoded_bytes).sum();
        let round_bytes = (encoded as u64).next_multiple_of(JOURNAL_BLOCK_BYTES);
        if round_bytes > self.area_bytes() {
            return Err(JournalError::RoundTooLarge {
                round_bytes,
                ring_bytes: self.header.ring_bytes,
            });
        }
        let wraps = self.head.position + round_bytes > self.header.ring_bytes;
        let position = if wraps {
            JOURNAL_BLOCK_BYTES
        } else {
            self.head.position
        };
        // The stretch a wrapping round skips at the ring's end stays taken
        // until the start passes it, unless nothing is live: then no record
        // lies between the start and the end, and the round may have it all.
        let nothing_live = self.written_bytes == self.start_written_bytes;
        let gap_bytes = if wraps && !nothing_live {
            self.header.ring_bytes - self.head.position
        } else {
            0
        };
        let needed_bytes = round_bytes + gap_bytes;
        if needed_bytes > self.free_bytes() {
            return Err(JournalError::Full {
                needed_bytes,
                free_bytes: self.free_bytes(),
            });
        }
        let mut bytes = B::with_len(round_bytes as usize);
        let out = bytes.bytes_mut();
        let first_seq = self.head.seq;
        let mut at = 0;
        for (i, record) in records.iter().enumerate() {
            at = record.encode_at(
                JournalSeq(first_seq.0 + i as u64),
                self.header.ring_id,
                out,
                at,
            );
        }
        out[at..].fill(0);
        self.written_bytes += needed_bytes;
        let end = position + round_bytes;
        self.head = RingPosition {
            // A round that ends at the ring's end leaves the next one to wrap.
            position: end,
            seq: JournalSeq(first_seq.0 + records.len() as u64),
        };
        assert!(self.written_bytes - self.start_written_bytes <= self.area_bytes());
        Ok(RoundWrite {
            position,
            bytes,
            first_seq,
            records: records.len(),
        })
    }

    pub fn mark(&self) -> RingMark {
        RingMark {
            head: self.head,
            written_bytes: self.written_bytes,
        }
    }

    /// Releases the records before `mark` (a checkpoint made them
    /// unnecessary) and returns the header block that says so, to be written
    /// durably before the room is used: until then a crash finds the old
    /// header, whose records are all still in place.
    pub fn release_to(&mut self, mark: RingMark) -> Vec<u8> {
        self.release_with_id(mark, self.header.ring_id)
    }

    fn release_with_id(&mut self, mark: RingMark, ring_id: u64) -> Vec<u8> {
        assert!(
            mark.written_bytes >= self.start_written_bytes,
            "marks are released in order"
        );
        assert!(mark.written_bytes <= self.written_bytes);
        let previous = self.header;
        let position = if mark.head.position >= self.header.ring_bytes {
            JOURNAL_BLOCK_BYTES
        } else {
            mark.head.position
        };
        self.header = JournalHeader {
            generation: previous.generation + 1,
            ring_bytes: previous.ring_bytes,
            start: RingPosition {
                position,
                seq: mark.head.seq,
            },
            ring_id,
        };
        self.start_written_bytes = mark.written_bytes;
        self.header.encode_block(Some(&previous))
    }
}

enum Found<'a> {
    Record(Record<'a>, u64),
    /// Not the expected record: another's bytes, zeros, a stale one.
    Absent,
    /// The expected record's header is there and the record is not whole:
    /// a torn round. Nothing after it was acknowledged.
    Torn,
}

/// Decodes the record at `at` if it is whole and is the one expected next.
fn record_at(ring: &[u8], at: u64, expected: JournalSeq, ring_id: u64) -> Found<'_> {
    let Some(at) = usize::try_from(at).ok() else {
        return Found::Absent;
    };
    let Some(head) = at
        .checked_add(RECORD_HEADER_BYTES)
        .and_then(|end| ring.get(at..end))
    else {
        return Found::Absent;
    };
    let (u32_at, u64_at) = (|i| le_u32(head, i), |i| le_u64(head, i));
    if u32_at(0) != RECORD_MAGIC || u64_at(8) != expected.0 || u64_at(40) != ring_id {
        return Found::Absent;
    }
    match whole_record(ring, at, head, expected) {
        Some((record, end)) => Found::Record(record, end),
        None => Found::Torn,
    }
}

fn whole_record<'a>(
    ring: &'a [u8],
    at: usize,
    head: &[u8],
    expected: JournalSeq,
) -> Option<(Record<'a>, u64)> {
    let (u32_at, u64_at) = (|i| le_u32(head, i), |i| le_u64(head, i));
    let kind = head[16];
    let reserved = head[17];
    let log_len = u16::from_le_bytes([head[18], head[19]]) as usize;
    let bytes_len = u32_at(20) as usize;
    if reserved != 0 || log_len > JOURNAL_LOG_NAME_BYTES_MAX || bytes_len > JOURNAL_CHUNK_BYTES_MAX
    {
        return None;
    }
    let end = at + RECORD_HEADER_BYTES + log_len + bytes_len;
    let whole = ring.get(at..end)?;
    if u32_at(4) != crc32c::crc32c(&whole[8..]) {
        return None;
    }
    let log =
        std::str::from_utf8(&whole[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + log_len]).ok()?;
    check_log_name(log).ok()?;
    let segment_base = u64_at(24) as i64;
    let position = u64_at(32);
    let body = match kind {
        KIND_WRITE => {
            check_chunk(position, bytes_len).ok()?;
            if segment_base < 0 {
                return None;
            }
            RecordBody::Write {
                segment_base: Offset(segment_base),
                position,
                bytes: &whole[RECORD_HEADER_BYTES + log_len..],
            }
        }
        KIND_FENCE if bytes_len == 0 && segment_base == 0 && position == 0 => RecordBody::Fence,
        KIND_SEGMENT_FENCE if bytes_len == 0 && segment_base >= 0 && position == 0 => {
            RecordBody::SegmentFence {
                segment_base: Offset(segment_base),
            }
        }
        _ => return None,
    };
    Some((
        Record {
            seq: expected,
            log,
            body,
        },
        end as u64,
    ))
}

/// The live records of a ring image (the whole journal file), oldest
/// first: from the header's start, each the next sequence number with a
/// valid CRC, found where the record before it ended, at the next block (a
/// new round) or at the start of the record area (a round that wrapped).
/// The first place none is found ends them.
pub fn scan(ring: &[u8]) -> Result<Scan<'_>, JournalError> {
    let header_block = ring
        .get(..JOURNAL_BLOCK_BYTES as usize)
        .ok_or(JournalError::Header {
            reason: "the file is shorter than its header block",
        })?;
    let header = JournalHeader::decode_block(header_block)?;
    if header.ring_bytes != ring.len() as u64 {
        return Err(JournalError::Header {
            reason: "the header's ring size is not the file's",
        });
    }
    let mut records = Vec::new();
    let mut at = header.start.position;
    let mut expected = header.start.seq;
    // At most one record per 40 bytes of the record area: a bound on the
    // loop whatever the bytes say.
    let records_max = (ring.len() / RECORD_HEADER_BYTES) + 1;
    'records: while records.len() < records_max {
        for candidate in record_candidates(at) {
            match record_at(ring, candidate, expected, header.ring_id) {
                Found::Record(record, end) => {
                    records.push(record);
                    at = end;
                    let Some(next) = expected.0.checked_add(1) else {
                        break 'records;
                    };
                    expected = JournalSeq(next);
                    continue 'records;
                }
                Found::Torn => break 'records,
                Found::Absent => {}
            }
        }
        break;
    }
    let next = if records.is_empty() {
        header.start
    } else {
        RingPosition {
            position: at.next_multiple_of(JOURNAL_BLOCK_BYTES),
            seq: expected,
        }
    };
    Ok(Scan {
        header,
        records,
        next,
    })
}

/// What a scan found: the header in force, the live records, and where a
/// round after them would go (so a writer resumes past them).
#[derive(Debug)]
pub struct Scan<'a> {
    pub header: JournalHeader,
    pub records: Vec<Record<'a>>,
    pub next: RingPosition,
}

/// The records replay writes, in journal order: every log's writes after
/// its last fence and after the last fence of their own segment.
pub fn replay_plan<'a>(records: &[Record<'a>]) -> Vec<Record<'a>> {
    use std::collections::HashMap;
    let mut last_fence: HashMap<&str, usize> = HashMap::new();
    let mut last_segment_fence: HashMap<(&str, Offset), usize> = HashMap::new();
    for (i, record) in records.iter().enumerate() {
        match record.body {
            RecordBody::Fence => {
                last_fence.insert(record.log, i);
            }
            RecordBody::SegmentFence { segment_base } => {
                last_segment_fence.insert((record.log, segment_base), i);
            }
            RecordBody::Write { .. } => {}
        }
    }
    records
        .iter()
        .enumerate()
        .filter(|(i, r)| match r.body {
            RecordBody::Write { segment_base, .. } => {
                last_fence.get(r.log).is_none_or(|fence| i > fence)
                    && last_segment_fence
                        .get(&(r.log, segment_base))
                        .is_none_or(|fence| i > fence)
            }
            RecordBody::Fence | RecordBody::SegmentFence { .. } => false,
        })
        .map(|(_, r)| *r)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RING_BYTES: u64 = 64 * 1024;
    const RING_ID: u64 = 0x005e_ed1d;

    /// A ring image as a file would hold it after the writer's writes.
    struct Image {
        bytes: Vec<u8>,
    }

    impl Image {
        fn new(writer: &RingWriter) -> Image {
            let mut bytes = vec![0u8; RING_BYTES as usize];
            bytes[..JOURNAL_BLOCK_BYTES as usize]
                .copy_from_slice(&writer.header().encode_block(None));
            Image { bytes }
        }

        fn write(&mut self, position: u64, data: &[u8]) {
            let at = position as usize;
            self.bytes[at..at + data.len()].copy_from_slice(data);
        }
    }

    fn chunk(fill: u8, blocks: usize) -> Vec<u8> {
        vec![fill; blocks * JOURNAL_BLOCK_BYTES as usize]
    }

    #[test]
    fn a_segment_fence_hides_only_its_own_segment_before_it() {
        let mut writer = RingWriter::new(RING_BYTES, JournalSeq(0), RING_ID).unwrap();
        let mut image = Image::new(&writer);
        let (a, b, c) = (chunk(1, 1), chunk(2, 1), chunk(3, 1));
        for specs in [
            vec![
                RecordSpec::write("t-0", Offset(0), 0, &a),
                RecordSpec::write("t-0", Offset(50), 0, &b),
                RecordSpec::write("t-1", Offset(0), 0, &a),
            ],
            vec![RecordSpec::segment_fence("t-0", Offset(0))],
            vec![RecordSpec::write("t-0", Offset(0), 4096, &c)],
        ] {
            let round = writer.round(&specs).unwrap();
            image.write(round.position, &round.bytes);
        }
        let records = scan(&image.bytes).unwrap().records;
        assert_eq!(
            records[3].body,
            RecordBody::SegmentFence {
                segment_base: Offset(0)
            }
        );
        let kept: Vec<(&str, Offset, u8)> = replay_plan(&records)
            .iter()
            .map(|r| match r.body {
                RecordBody::Write {
                    segment_base,
                    bytes,
                    ..
                } => (r.log, segment_base, bytes[0]),
                _ => unreachable!("replay plans writes only"),
            })
            .collect();
        // t-0's segment 0 before the fence is gone; its segment 50, t-1's
        // segment 0 and the write after the fence stay.
        assert_eq!(
            kept,
            vec![
                ("t-0", Offset(50), 2),
                ("t-1", Offset(0), 1),
                ("t-0", Offset(0), 3)
            ]
        );
    }

    #[test]
    fn a_round_reads_back_and_fences_hide_what_came_before() {
        let mut writer = RingWriter::new(RING_BYTES, JournalSeq(7), RING_ID).unwrap();
        let mut image = Image::new(&writer);
        let (a, b) = (chunk(1, 1), chunk(2, 2));
        let round = writer
            .round(&[
                RecordSpec::write("t-0", Offset(0), 0, &a),
                RecordSpec::write("t-1", Offset(100), 8192, &b),
            ])
            .unwrap();
        image.write(round.position, &round.bytes);
        let fence = writer.round(&[RecordSpec::fence("t-0")]).unwrap();
        image.write(fence.position, &fence.bytes);

        let records = scan(&image.bytes).unwrap().records;
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].seq, JournalSeq(7));
        assert_eq!(records[2].body, RecordBody::Fence);
        let plan = replay_plan(&records);
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].log, "t-1");
        assert_eq!(
            plan[0].body,
            RecordBody::Write {
                segment_base: Offset(100),
                position: 8192,
                bytes: &b
            }
        );
    }

    #[test]
    fn bad_names_and_unaligned_chunks_are_refused_before_anything_is_written() {
        let mut writer = RingWriter::new(RING_BYTES, JournalSeq(0), RING_ID).unwrap();
        let bytes = [0u8; 100];
        for (log, position, len) in [
            ("../x", 0, 4096),
            ("a/b", 0, 4096),
            ("", 0, 4096),
            ("ok", 10, 4096),
            ("ok", 0, 100),
        ] {
            let spec = RecordSpec {
                log,
                body: RecordBody::Write {
                    segment_base: Offset(0),
                    position,
                    bytes: if len == 100 { &bytes } else { &[0u8; 4096] },
                },
            };
            assert!(writer.round(&[spec]).is_err(), "{log} {position} {len}");
        }
        assert_eq!(writer.head().seq, JournalSeq(0));
        assert_eq!(
            RingWriter::new(1000, JournalSeq(0), RING_ID).unwrap_err(),
            JournalError::RingSize { ring_bytes: 1000 }
        );
    }

    /// A round's first sector lost and the rest landed: nothing of it is
    /// read, and after a resume the old records that survived further on
    /// cannot pass for the new rounds' (they carry the old id), even where
    /// their sequence numbers are the ones expected next.
    #[test]
    fn records_of_a_torn_round_never_come_back_after_a_resume() {
        let mut writer = RingWriter::new(RING_BYTES, JournalSeq(0), RING_ID).unwrap();
        let mut image = Image::new(&writer);
        // Fence records of 64 bytes: the 65th starts a block after the first.
        let name = "a-log-name-of-16";
        let fences: Vec<RecordSpec> = (0..70).map(|_| RecordSpec::fence(name)).collect();
        assert_eq!(RECORD_HEADER_BYTES + name.len(), 64);
        let round = writer.round(&fences).unwrap();
        image.write(round.position, &round.bytes);
        image.write(round.position, &[0u8; 512]);
        let found = scan(&image.bytes).unwrap();
        assert!(found.records.is_empty());

        let (mut resumed, block) = RingWriter::resume(&found, RING_ID + 1);
        image.write(0, &block);
        // 64 records of the new round end where old record 64 begins.
        let again = resumed.round(&fences[..64]).unwrap();
        assert_eq!(again.position, round.position);
        assert_eq!(again.first_seq, JournalSeq(0));
        image.write(again.position, &again.bytes[..JOURNAL_BLOCK_BYTES as usize]);
        let found = scan(&image.bytes).unwrap();
        assert_eq!(found.records.len(), 64, "old record 64 is not read as new");

        // The same, had the id not changed: the old records are taken.
        let mut same_id = image.bytes.clone();
        same_id[..JOURNAL_BLOCK_BYTES as usize]
            .copy_from_slice(&writer.header().encode_block(None));
        let mut again_old_id = RingWriter::new(RING_BYTES, JournalSeq(0), RING_ID).unwrap();
        let first = again_old_id.round(&fences[..64]).unwrap();
        same_id[first.position as usize..first.position as usize + JOURNAL_BLOCK_BYTES as usize]
            .copy_from_slice(&first.bytes[..JOURNAL_BLOCK_BYTES as usize]);
        assert!(scan(&same_id).unwrap().records.len() > 64);
    }

    /// A producer's bytes shaped like a record, inside a chunk where a scan
    /// looks for the next round, are not taken: the producer cannot know
    /// the ring's id.
    #[test]
    fn a_record_forged_inside_a_chunk_is_not_read() {
        let mut writer = RingWriter::new(RING_BYTES, JournalSeq(10), RING_ID).unwrap();
        let mut image = Image::new(&writer);
        let small = writer.round(&[RecordSpec::fence("t-0")]).unwrap();
        image.write(small.position, &small.bytes);
        // What a scan tries next: the block after the round. A stale chunk
        // there holds a record-shaped block numbered as the next record.
        let forge = |ring_id: u64| {
            let mut forger = RingWriter::new(RING_BYTES, JournalSeq(11), ring_id).unwrap();
            let chunk = vec![0xab; JOURNAL_BLOCK_BYTES as usize];
            forger
                .round(&[RecordSpec::write("t-1", Offset(0), 0, &chunk)])
                .unwrap()
                .bytes
        };
        let next_block = small.position + JOURNAL_BLOCK_BYTES;
        image.write(next_block, &forge(RING_ID ^ 0xdead_beef));
        assert_eq!(scan(&image.bytes).unwrap().records.len(), 1);
        // Knowing the id, it would have been.
        image.write(next_block, &forge(RING_ID));
        assert_eq!(scan(&image.bytes).unwrap().records.len(), 2);
    }

    #[test]
    fn headers_with_counters_near_overflow_are_refused() {
        let writer = RingWriter::new(RING_BYTES, JournalSeq(0), RING_ID).unwrap();
        for header in [
            JournalHeader {
                generation: u64::MAX,
                ..writer.header()
            },
            JournalHeader {
                start: RingPosition {
                    position: JOURNAL_BLOCK_BYTES,
                    seq: JournalSeq(u64::MAX),
                },
                ..writer.header()
            },
        ] {
            assert!(JournalHeader::decode_block(&header.encode_block(None)).is_err());
        }
    }

    #[test]
    fn a_torn_header_write_leaves_the_older_header() {
        let mut writer = RingWriter::new(RING_BYTES, JournalSeq(0), RING_ID).unwrap();
        let first = writer.header();
        let mark = writer.mark();
        let block = writer.release_to(mark);
        let second = writer.header();
        assert_eq!(JournalHeader::decode_block(&block).unwrap(), second);
        // The new slot torn: the old one is still whole.
        let mut torn = block.clone();
        let at = (second.generation % 2) as usize * HEADER_SLOT_BYTES;
        torn[at + 20] ^= 0xff;
        assert_eq!(JournalHeader::decode_block(&torn).unwrap(), first);
        torn[(first.generation % 2) as usize * HEADER_SLOT_BYTES + 20] ^= 0xff;
        assert!(JournalHeader::decode_block(&torn).is_err());
    }

    /// (seq, log, `None` for a fence or the chunk's fill byte and blocks)
    type ModelRecord = (u64, String, Option<(u8, usize)>);

    #[derive(Clone, Debug)]
    enum Step {
        /// A round of (log index, blocks; 0 = a fence) records.
        Round(Vec<(u8, u8)>),
        /// A checkpoint that releases everything written so far.
        Checkpoint,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => prop::collection::vec((0u8..3, 0u8..4), 1..5).prop_map(Step::Round),
            1 => Just(Step::Checkpoint),
        ]
    }

    proptest! {
        /// Against a model (the records written since the last durable
        /// header): whatever the rounds, wraps and laps, a scan finds exactly
        /// those, and with the last round torn, a prefix of its records.
        #[test]
        fn a_scan_finds_exactly_the_records_since_the_last_checkpoint(
            first_seq in 0u64..1_000_000,
            steps in prop::collection::vec(step(), 1..80),
            tear in prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            let mut writer = RingWriter::new(RING_BYTES, JournalSeq(first_seq), RING_ID).unwrap();
            let mut image = Image::new(&writer);
            let mut live: Vec<ModelRecord> = Vec::new();
            let mut last_round: Option<(RoundWrite, usize)> = None;
            let mut fill = 0u8;
            for step in steps {
                match step {
                    Step::Checkpoint => {
                        let mark = writer.mark();
                        let block = writer.release_to(mark);
                        image.write(0, &block);
                        live.clear();
                        last_round = None;
                    }
                    Step::Round(specs) => {
                        let names: Vec<String> = specs.iter().map(|(log, _)| format!("topic-{log}")).collect();
                        let chunks: Vec<Vec<u8>> = specs
                            .iter()
                            .map(|&(_, blocks)| {
                                fill = fill.wrapping_add(1);
                                chunk(fill, blocks as usize)
                            })
                            .collect();
                        let records: Vec<RecordSpec> = specs
                            .iter()
                            .enumerate()
                            .map(|(i, &(_, blocks))| RecordSpec {
                                log: &names[i],
                                body: if blocks == 0 {
                                    RecordBody::Fence
                                } else {
                                    RecordBody::Write {
                                        segment_base: Offset(i as i64 * 10),
                                        position: u64::from(blocks) * JOURNAL_BLOCK_BYTES,
                                        bytes: &chunks[i],
                                    }
                                },
                            })
                            .collect();
                        let round = match writer.round(&records) {
                            Ok(round) => round,
                            Err(JournalError::Full { .. }) => {
                                // The writer waits for a checkpoint; so does the model.
                                let mark = writer.mark();
                                image.write(0, &writer.release_to(mark));
                                live.clear();
                                writer.round(&records).unwrap()
                            }
                            Err(e) => panic!("{e}"),
                        };
                        prop_assert_eq!(round.first_seq.0, live.last().map_or(writer.header().start.seq.0, |l| l.0 + 1));
                        image.write(round.position, &round.bytes);
                        for (i, &(_, blocks)) in specs.iter().enumerate() {
                            let body = (blocks != 0).then(|| (chunks[i][0], blocks as usize));
                            live.push((round.first_seq.0 + i as u64, names[i].clone(), body));
                        }
                        last_round = Some((round, specs.len()));
                    }
                }
            }
            let mut expected = live.clone();
            if let (Some((index, garbage)), Some((round, count))) = (tear, &last_round) {
                // Bytes from a point in the last round on never reached the disk.
                let cut = index.index(round.bytes.len());
                let at = round.position as usize + cut;
                for b in &mut image.bytes[at..round.position as usize + round.bytes.len()] {
                    *b = garbage;
                }
                // Its records whose bytes all survived the tear are read, up
                // to the first that did not (a garbage byte equal to the one it
                // replaced changes nothing).
                let mut start = 0;
                let mut kept = 0;
                for record in &live[live.len() - count..] {
                    let len = RECORD_HEADER_BYTES + record.1.len() + record.2.map_or(0, |(_, b)| b * JOURNAL_BLOCK_BYTES as usize);
                    let on_disk = &image.bytes[round.position as usize + start..round.position as usize + start + len];
                    if on_disk != &round.bytes[start..start + len] {
                        break;
                    }
                    start += len;
                    kept += 1;
                }
                expected.truncate(live.len() - count + kept);
            }
            let found = scan(&image.bytes).unwrap();
            let (header, records) = (found.header, &found.records);
            prop_assert_eq!(header, writer.header());
            prop_assert_eq!(records.len(), expected.len());
            for (record, (seq, log, body)) in records.iter().zip(&expected) {
                prop_assert_eq!(record.seq.0, *seq);
                prop_assert_eq!(record.log, log.as_str());
                match (record.body, body) {
                    (RecordBody::Fence, None) => {}
                    (RecordBody::Write { bytes, .. }, Some((fill, blocks))) => {
                        prop_assert_eq!(bytes.len(), blocks * JOURNAL_BLOCK_BYTES as usize);
                        prop_assert!(bytes.iter().all(|b| b == fill));
                    }
                    (got, want) => prop_assert!(false, "record {:?} against {:?}", got, want),
                }
            }
        }
    }
}
