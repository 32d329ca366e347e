//! Record batch v2: the unit producers send, the log stores and consumers fetch,
//! byte for byte the layout of Kafka's message format v2. This file owns the
//! layout (see docs/formats/record-batch.md), the builder and the zero-copy
//! validating reader. Decoding never panics and never allocates from an
//! unchecked length: every length read from input is bounded first.

use std::borrow::Cow;
use std::io::Read;

use crate::ids::{LeaderEpoch, Offset, ProducerEpoch, ProducerId, Sequence};
use crate::varint::{get_varint, get_varlong, put_varint, put_varlong, varint_len, varlong_len};

/// Size of the fixed batch header that precedes the records section.
pub const BATCH_HEADER_BYTES: usize = 61;
/// Bytes before the region that `batch_length` counts: base offset and the length itself.
pub const LOG_OVERHEAD_BYTES: usize = 12;
/// The only batch format this crate reads or writes.
pub const MAGIC_V2: i8 = 2;

/// Byte offsets of the header fields, all big-endian.
pub mod field {
    pub const BASE_OFFSET: usize = 0;
    pub const BATCH_LENGTH: usize = 8;
    pub const PARTITION_LEADER_EPOCH: usize = 12;
    pub const MAGIC: usize = 16;
    pub const CRC: usize = 17;
    pub const ATTRIBUTES: usize = 21;
    pub const LAST_OFFSET_DELTA: usize = 23;
    pub const BASE_TIMESTAMP: usize = 27;
    pub const MAX_TIMESTAMP: usize = 35;
    pub const PRODUCER_ID: usize = 43;
    pub const PRODUCER_EPOCH: usize = 51;
    pub const BASE_SEQUENCE: usize = 53;
    pub const RECORD_COUNT: usize = 57;
}

const ATTRIBUTE_CODEC_MASK: i16 = 0x07;
const ATTRIBUTE_TRANSACTIONAL: i16 = 0x10;
const ATTRIBUTE_CONTROL: i16 = 0x20;

/// Compression of the records section. Numeric codes are Kafka's, so stored
/// batches stay readable by Kafka tooling; codecs Ringlog does not implement
/// (gzip 1, snappy 2, lz4 3) are rejected as unsupported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    None,
    Zstd,
}

impl Compression {
    pub fn code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zstd => 4,
        }
    }

    pub fn from_code(code: u8) -> Result<Compression, BatchError> {
        match code {
            0 => Ok(Compression::None),
            4 => Ok(Compression::Zstd),
            other => Err(BatchError::UnsupportedCodec(other)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zstd => "zstd",
        }
    }
}

/// Why bytes are not a valid batch. Every decode of untrusted input returns one of
/// these instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch truncated: needs {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("batch length field {0} is below the header size or negative")]
    InvalidLength(i32),
    #[error("batch of {size_bytes} bytes exceeds the bound of {size_bytes_max} bytes")]
    TooLarge {
        size_bytes: usize,
        size_bytes_max: usize,
    },
    #[error("unsupported batch magic {0} (only 2 is supported)")]
    UnsupportedMagic(i8),
    #[error("CRC-32C mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("unsupported compression codec {0}")]
    UnsupportedCodec(u8),
    #[error("base offset {0} is negative or too close to the largest offset")]
    InvalidBaseOffset(i64),
    #[error("invalid record count {0}")]
    InvalidRecordCount(i32),
    #[error("invalid last offset delta {last_offset_delta} for {record_count} records")]
    InvalidLastOffsetDelta {
        last_offset_delta: i32,
        record_count: i32,
    },
    #[error("batch holds no records")]
    Empty,
    #[error("record {index} is corrupt: {reason}")]
    CorruptRecord { index: i32, reason: &'static str },
    #[error("records section holds {0} bytes after the last record")]
    TrailingBytes(usize),
    #[error("records section decompresses to more than {decompressed_bytes_max} bytes")]
    DecompressedTooLarge { decompressed_bytes_max: usize },
    #[error("records section does not decompress: {0}")]
    Decompression(String),
    #[error("records section does not compress: {0}")]
    Compression(String),
    #[error("invalid control batch: {0}")]
    InvalidControl(&'static str),
}

/// The decoded fixed header of one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: Offset,
    pub batch_length: i32,
    pub partition_leader_epoch: LeaderEpoch,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    pub base_sequence: Sequence,
    pub record_count: i32,
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl BatchHeader {
    /// Decodes and sanity-checks the fixed header at the front of `bytes`. Checks
    /// only what the header alone can tell (length, magic, codec, counts); the CRC
    /// needs the whole batch, see [`RecordBatch::parse`].
    pub fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
        if bytes.len() < BATCH_HEADER_BYTES {
            return Err(BatchError::Truncated {
                needed: BATCH_HEADER_BYTES,
                available: bytes.len(),
            });
        }
        let header = BatchHeader {
            base_offset: Offset(be_i64(bytes, field::BASE_OFFSET)),
            batch_length: be_i32(bytes, field::BATCH_LENGTH),
            partition_leader_epoch: LeaderEpoch(be_i32(bytes, field::PARTITION_LEADER_EPOCH)),
            magic: bytes[field::MAGIC] as i8,
            crc: u32::from_be_bytes(bytes[field::CRC..field::CRC + 4].try_into().expect("4")),
            attributes: be_i16(bytes, field::ATTRIBUTES),
            last_offset_delta: be_i32(bytes, field::LAST_OFFSET_DELTA),
            base_timestamp_ms: be_i64(bytes, field::BASE_TIMESTAMP),
            max_timestamp_ms: be_i64(bytes, field::MAX_TIMESTAMP),
            producer_id: ProducerId(be_i64(bytes, field::PRODUCER_ID)),
            producer_epoch: ProducerEpoch(be_i16(bytes, field::PRODUCER_EPOCH)),
            base_sequence: Sequence(be_i32(bytes, field::BASE_SEQUENCE)),
            record_count: be_i32(bytes, field::RECORD_COUNT),
        };
        header.check()?;
        Ok(header)
    }

    fn check(&self) -> Result<(), BatchError> {
        if self.batch_length < (BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES) as i32 {
            return Err(BatchError::InvalidLength(self.batch_length));
        }
        if self.magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(self.magic));
        }
        Compression::from_code((self.attributes & ATTRIBUTE_CODEC_MASK) as u8)?;
        if self.record_count < 0 {
            return Err(BatchError::InvalidRecordCount(self.record_count));
        }
        // Offsets past the batch must stay representable: next_offset() never overflows.
        if self.base_offset.0 < 0
            || self.base_offset.0 > i64::MAX - i64::from(self.last_offset_delta.max(0)) - 1
        {
            return Err(BatchError::InvalidBaseOffset(self.base_offset.0));
        }
        if self.last_offset_delta < 0 || self.last_offset_delta < self.record_count - 1 {
            return Err(BatchError::InvalidLastOffsetDelta {
                last_offset_delta: self.last_offset_delta,
                record_count: self.record_count,
            });
        }
        Ok(())
    }

    /// Whole size of the batch on the wire and on disk.
    pub fn total_bytes(&self) -> usize {
        LOG_OVERHEAD_BYTES + self.batch_length as usize
    }

    pub fn compression(&self) -> Compression {
        Compression::from_code((self.attributes & ATTRIBUTE_CODEC_MASK) as u8)
            .expect("codec checked in parse")
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTRIBUTE_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTRIBUTE_CONTROL != 0
    }

    pub fn last_offset(&self) -> Offset {
        self.base_offset.plus(i64::from(self.last_offset_delta))
    }

    /// The offset after this batch: where the next batch must start.
    pub fn next_offset(&self) -> Offset {
        self.last_offset().plus(1)
    }

    /// A batch as a producer must send it: at least one record, offsets dense.
    pub fn check_producer_batch(&self) -> Result<(), BatchError> {
        if self.record_count == 0 {
            return Err(BatchError::Empty);
        }
        if self.last_offset_delta != self.record_count - 1 {
            return Err(BatchError::InvalidLastOffsetDelta {
                last_offset_delta: self.last_offset_delta,
                record_count: self.record_count,
            });
        }
        Ok(())
    }
}

/// CRC-32C of a whole encoded batch, over attributes to the end.
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[field::ATTRIBUTES..])
}

/// Reads the total size of the batch starting at `bytes` from its length field
/// alone, so a scanner knows how much to read before it can parse.
pub fn peek_total_bytes(bytes: &[u8]) -> Option<i64> {
    if bytes.len() < LOG_OVERHEAD_BYTES {
        return None;
    }
    Some(LOG_OVERHEAD_BYTES as i64 + i64::from(be_i32(bytes, field::BATCH_LENGTH)))
}

/// Writes the two fields a broker stamps into a stored batch. Neither is covered
/// by the CRC, so stamping needs no recomputation.
pub fn stamp(batch: &mut [u8], base_offset: Offset, leader_epoch: LeaderEpoch) {
    assert!(batch.len() >= BATCH_HEADER_BYTES);
    batch[field::BASE_OFFSET..field::BASE_OFFSET + 8].copy_from_slice(&base_offset.0.to_be_bytes());
    batch[field::PARTITION_LEADER_EPOCH..field::PARTITION_LEADER_EPOCH + 4]
        .copy_from_slice(&leader_epoch.0.to_be_bytes());
}

/// Computes a built batch's CRC into its header.
pub fn seal_crc(batch: &mut [u8]) {
    assert!(batch.len() >= BATCH_HEADER_BYTES);
    let crc = compute_crc(batch);
    batch[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Writes a producer's id, epoch and first sequence into a built batch and
/// recomputes its CRC (which covers them). An idempotent producer stamps a
/// batch once, when it first sends it: a retry carries the same bytes, so
/// the leader recognizes it.
pub fn stamp_producer(
    batch: &mut [u8],
    producer_id: ProducerId,
    producer_epoch: ProducerEpoch,
    base_sequence: Sequence,
) {
    assert!(batch.len() >= BATCH_HEADER_BYTES);
    batch[field::PRODUCER_ID..field::PRODUCER_ID + 8].copy_from_slice(&producer_id.0.to_be_bytes());
    batch[field::PRODUCER_EPOCH..field::PRODUCER_EPOCH + 2]
        .copy_from_slice(&producer_epoch.0.to_be_bytes());
    batch[field::BASE_SEQUENCE..field::BASE_SEQUENCE + 4]
        .copy_from_slice(&base_sequence.0.to_be_bytes());
    seal_crc(batch);
}

/// A borrowed, validated batch: header decoded, length exact, CRC checked.
#[derive(Clone, Copy, Debug)]
pub struct RecordBatch<'a> {
    bytes: &'a [u8],
    header: BatchHeader,
}

impl<'a> RecordBatch<'a> {
    /// Validates the batch at the front of `bytes` (header, length, CRC) and
    /// returns it with the number of bytes it spans. `size_bytes_max` bounds the
    /// batch before anything past its header is looked at.
    pub fn parse_prefix(
        bytes: &'a [u8],
        size_bytes_max: usize,
    ) -> Result<(RecordBatch<'a>, usize), BatchError> {
        let header = BatchHeader::parse(bytes)?;
        let total = header.total_bytes();
        if total > size_bytes_max {
            return Err(BatchError::TooLarge {
                size_bytes: total,
                size_bytes_max,
            });
        }
        if bytes.len() < total {
            return Err(BatchError::Truncated {
                needed: total,
                available: bytes.len(),
            });
        }
        let bytes = &bytes[..total];
        let computed = compute_crc(bytes);
        if computed != header.crc {
            return Err(BatchError::CrcMismatch {
                stored: header.crc,
                computed,
            });
        }
        Ok((RecordBatch { bytes, header }, total))
    }

    /// Validates that `bytes` is exactly one batch.
    pub fn parse(bytes: &'a [u8], size_bytes_max: usize) -> Result<RecordBatch<'a>, BatchError> {
        let (batch, used) = Self::parse_prefix(bytes, size_bytes_max)?;
        if used != bytes.len() {
            return Err(BatchError::TrailingBytes(bytes.len() - used));
        }
        Ok(batch)
    }

    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The records section, decompressed if needed into at most
    /// `decompressed_bytes_max` bytes. Uncompressed sections are borrowed.
    pub fn records_section(
        &self,
        decompressed_bytes_max: usize,
    ) -> Result<RecordsSection<'a>, BatchError> {
        let raw = &self.bytes[BATCH_HEADER_BYTES..];
        let data = match self.header.compression() {
            Compression::None => Cow::Borrowed(raw),
            Compression::Zstd => Cow::Owned(zstd_decompress(raw, decompressed_bytes_max)?),
        };
        Ok(RecordsSection {
            data,
            header: self.header,
        })
    }

    /// Decodes every record, checking each against the header: the deep check
    /// that consumers and `verify-log` run.
    pub fn validate_records(&self, decompressed_bytes_max: usize) -> Result<(), BatchError> {
        let section = self.records_section(decompressed_bytes_max)?;
        for record in section.iter() {
            record?;
        }
        Ok(())
    }
}

fn zstd_decompress(raw: &[u8], decompressed_bytes_max: usize) -> Result<Vec<u8>, BatchError> {
    let declared = zstd::zstd_safe::get_frame_content_size(raw)
        .ok()
        .flatten()
        .unwrap_or(0);
    // The declared size is a hint from untrusted input: cap it before allocating.
    let mut out = Vec::with_capacity((declared as usize).min(decompressed_bytes_max));
    let decoder = zstd::stream::read::Decoder::new(raw)
        .map_err(|e| BatchError::Decompression(e.to_string()))?;
    decoder
        .take(decompressed_bytes_max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| BatchError::Decompression(e.to_string()))?;
    if out.len() > decompressed_bytes_max {
        return Err(BatchError::DecompressedTooLarge {
            decompressed_bytes_max,
        });
    }
    Ok(out)
}

/// The (decompressed) records section of a batch.
#[derive(Debug)]
pub struct RecordsSection<'a> {
    data: Cow<'a, [u8]>,
    header: BatchHeader,
}

impl RecordsSection<'_> {
    pub fn iter(&self) -> RecordIter<'_> {
        RecordIter {
            rest: &self.data,
            header: self.header,
            index: 0,
            previous_offset_delta: -1,
            failed: false,
        }
    }

    pub fn len_bytes(&self) -> usize {
        self.data.len()
    }
}

/// One header of a record: a string-like key and an optional value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// A record to append, as the builder takes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Record<'a> {
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a [RecordHeader<'a>],
}

/// A decoded record borrowed from its records section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub offset: Offset,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<RecordHeader<'a>>,
}

/// Iterates the records of a section, validating each; yields an error once and
/// then stops. After the last record it reports leftover bytes or missing records.
#[derive(Debug)]
pub struct RecordIter<'a> {
    rest: &'a [u8],
    header: BatchHeader,
    index: i32,
    previous_offset_delta: i32,
    failed: bool,
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordRef<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.index == self.header.record_count {
            if !self.rest.is_empty() {
                self.failed = true;
                return Some(Err(BatchError::TrailingBytes(self.rest.len())));
            }
            return None;
        }
        let result = self.decode_one();
        if result.is_err() {
            self.failed = true;
        }
        self.index += 1;
        Some(result)
    }
}

impl<'a> RecordIter<'a> {
    fn corrupt(&self, reason: &'static str) -> BatchError {
        BatchError::CorruptRecord {
            index: self.index,
            reason,
        }
    }

    fn decode_one(&mut self) -> Result<RecordRef<'a>, BatchError> {
        let (length, used) = get_varint(self.rest).ok_or_else(|| self.corrupt("bad length"))?;
        if length < 0 || length as usize > self.rest.len() - used {
            return Err(self.corrupt("length past the section end"));
        }
        let body = &self.rest[used..used + length as usize];
        self.rest = &self.rest[used + length as usize..];
        let mut cursor = Cursor { bytes: body };
        let _attributes = cursor.byte().ok_or_else(|| self.corrupt("no attributes"))?;
        let timestamp_delta = cursor
            .varlong()
            .ok_or_else(|| self.corrupt("bad timestamp"))?;
        let offset_delta = cursor
            .varint()
            .ok_or_else(|| self.corrupt("bad offset delta"))?;
        if offset_delta <= self.previous_offset_delta
            || offset_delta > self.header.last_offset_delta
        {
            return Err(self.corrupt("offset delta out of order or past the last offset"));
        }
        self.previous_offset_delta = offset_delta;
        let key = cursor
            .nullable_bytes()
            .ok_or_else(|| self.corrupt("bad key"))?;
        let value = cursor
            .nullable_bytes()
            .ok_or_else(|| self.corrupt("bad value"))?;
        let header_count = cursor
            .varint()
            .ok_or_else(|| self.corrupt("bad header count"))?;
        // Each header takes at least two bytes, which bounds the count before allocating.
        if header_count < 0 || header_count as usize > cursor.bytes.len() / 2 {
            return Err(self.corrupt("bad header count"));
        }
        let mut headers = Vec::with_capacity(header_count as usize);
        for _ in 0..header_count {
            let key = cursor
                .nullable_bytes()
                .flatten()
                .ok_or_else(|| self.corrupt("bad header key"))?;
            let value = cursor
                .nullable_bytes()
                .ok_or_else(|| self.corrupt("bad header value"))?;
            headers.push(RecordHeader { key, value });
        }
        if !cursor.bytes.is_empty() {
            return Err(self.corrupt("bytes left inside the record"));
        }
        let timestamp_ms = self
            .header
            .base_timestamp_ms
            .checked_add(timestamp_delta)
            .ok_or_else(|| self.corrupt("timestamp overflow"))?;
        Ok(RecordRef {
            offset: self
                .header
                .base_offset
                .0
                .checked_add(i64::from(offset_delta))
                .map(Offset)
                .ok_or_else(|| self.corrupt("offset overflow"))?,
            timestamp_ms,
            key,
            value,
            headers,
        })
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.bytes.split_first()?;
        self.bytes = rest;
        Some(first)
    }

    fn varint(&mut self) -> Option<i32> {
        let (v, used) = get_varint(self.bytes)?;
        self.bytes = &self.bytes[used..];
        Some(v)
    }

    fn varlong(&mut self) -> Option<i64> {
        let (v, used) = get_varlong(self.bytes)?;
        self.bytes = &self.bytes[used..];
        Some(v)
    }

    /// A varint length then that many bytes; length -1 means null.
    /// The outer `None` is a decode failure, the inner one a null.
    fn nullable_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        let length = self.varint()?;
        if length == -1 {
            return Some(None);
        }
        if length < 0 || length as usize > self.bytes.len() {
            return None;
        }
        let (taken, rest) = self.bytes.split_at(length as usize);
        self.bytes = rest;
        Some(Some(taken))
    }
}

/// Builds one encoded batch from records, compressing the records section when
/// asked. Base offset and leader epoch are left for the broker to stamp.
#[derive(Debug)]
pub struct BatchBuilder {
    compression: Compression,
    zstd_level: i32,
    producer_id: ProducerId,
    producer_epoch: ProducerEpoch,
    base_sequence: Sequence,
    transactional: bool,
    control: bool,
    records: Vec<u8>,
    record_count: i32,
    base_timestamp_ms: i64,
    max_timestamp_ms: i64,
}

impl BatchBuilder {
    pub fn new(compression: Compression) -> BatchBuilder {
        BatchBuilder {
            compression,
            zstd_level: 1,
            producer_id: ProducerId::NONE,
            producer_epoch: ProducerEpoch::NONE,
            base_sequence: Sequence::NONE,
            transactional: false,
            control: false,
            // The header's bytes are reserved up front so an uncompressed batch
            // is finished in place, without copying its records.
            records: vec![0u8; BATCH_HEADER_BYTES],
            record_count: 0,
            base_timestamp_ms: 0,
            max_timestamp_ms: -1,
        }
    }

    /// Reserves room for `bytes` of encoded records up front, so a builder
    /// filled to a known bound (a producer's batch size) never grows and
    /// copies its records on the way there.
    pub fn with_capacity_bytes(mut self, bytes: usize) -> BatchBuilder {
        self.records.reserve(bytes);
        self
    }

    /// Level 1 is the default: on ~500 B JSON events it keeps almost all of level
    /// 3's ratio at half again the speed, and the producer's CPU is the bottleneck.
    pub fn zstd_level(mut self, level: i32) -> BatchBuilder {
        self.zstd_level = level;
        self
    }

    pub fn producer(
        mut self,
        id: ProducerId,
        epoch: ProducerEpoch,
        base_sequence: Sequence,
    ) -> BatchBuilder {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn transactional(mut self, transactional: bool) -> BatchBuilder {
        self.transactional = transactional;
        self
    }

    /// Marks the batch as a control batch (a transaction marker): only the
    /// broker writes those.
    pub(crate) fn control(mut self) -> BatchBuilder {
        self.control = true;
        self
    }

    pub fn record_count(&self) -> i32 {
        self.record_count
    }

    /// Uncompressed size the batch would have now: what batch size limits compare.
    pub fn size_bytes_uncompressed(&self) -> usize {
        self.records.len()
    }

    /// Size a record would add to the uncompressed batch.
    pub fn record_size_bytes(&self, record: &Record<'_>) -> usize {
        let body = self.record_body_bytes(record, self.record_count);
        varint_len(body as i32) + body
    }

    fn timestamp_delta(&self, record: &Record<'_>) -> i64 {
        if self.record_count == 0 {
            0
        } else {
            record.timestamp_ms.wrapping_sub(self.base_timestamp_ms)
        }
    }

    fn record_body_bytes(&self, record: &Record<'_>, offset_delta: i32) -> usize {
        record_body_bytes(record, self.timestamp_delta(record), offset_delta)
    }

    pub fn push(&mut self, record: &Record<'_>) {
        assert!(self.record_count < i32::MAX, "record count bound");
        if self.record_count == 0 {
            self.base_timestamp_ms = record.timestamp_ms;
        }
        let offset_delta = self.record_count;
        let body = self.record_body_bytes(record, offset_delta);
        let timestamp_delta = self.timestamp_delta(record);
        let before = self.records.len();
        put_record(
            &mut self.records,
            body,
            timestamp_delta,
            offset_delta,
            record,
        );
        debug_assert_eq!(self.records.len() - before, varint_len(body as i32) + body);
        self.max_timestamp_ms = self.max_timestamp_ms.max(record.timestamp_ms);
        self.record_count += 1;
    }

    /// `push` of a record without headers whose value is written straight
    /// into the batch, so a producer that makes values (a load generator
    /// stamping a payload) does not first make them somewhere else and then
    /// copy them in. `write_value` must append exactly `value_len` bytes to
    /// the vector it is handed. Returns the record's encoded size, as
    /// `record_size_bytes` would have.
    pub fn push_written(
        &mut self,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value_len: usize,
        write_value: impl FnOnce(&mut Vec<u8>),
    ) -> usize {
        assert!(self.record_count < i32::MAX, "record count bound");
        let value_len_field = i32::try_from(value_len).expect("field under 2 GiB");
        if self.record_count == 0 {
            self.base_timestamp_ms = timestamp_ms;
        }
        let offset_delta = self.record_count;
        // Sized as an empty value, then the value's length field and bytes
        // put in its place.
        let shape = Record {
            timestamp_ms,
            key,
            value: Some(&[]),
            headers: &[],
        };
        let timestamp_delta = self.timestamp_delta(&shape);
        let body = record_body_bytes(&shape, timestamp_delta, offset_delta) - varint_len(0)
            + varint_len(value_len_field)
            + value_len;
        let before = self.records.len();
        put_varint(
            &mut self.records,
            i32::try_from(body).expect("record under 2 GiB"),
        );
        self.records.push(0);
        put_varlong(&mut self.records, timestamp_delta);
        put_varint(&mut self.records, offset_delta);
        put_nullable(&mut self.records, key);
        put_varint(&mut self.records, value_len_field);
        let value_start = self.records.len();
        write_value(&mut self.records);
        assert_eq!(
            self.records.len() - value_start,
            value_len,
            "a written value has its declared length"
        );
        put_varint(&mut self.records, 0);
        let size = self.records.len() - before;
        debug_assert_eq!(size, varint_len(body as i32) + body);
        self.max_timestamp_ms = self.max_timestamp_ms.max(timestamp_ms);
        self.record_count += 1;
        size
    }

    /// Encodes the batch. Fails for an empty batch, a compressor error, or a
    /// batch over 2 GiB.
    pub fn build(self) -> Result<Vec<u8>, BatchError> {
        let mut out = self.build_without_crc()?;
        seal_crc(&mut out);
        Ok(out)
    }

    /// As `build`, leaving the CRC field zero: for a producer that stamps
    /// its id and sequence at the first send ([`stamp_producer`], which
    /// computes the CRC), so the batch is checksummed once rather than twice.
    /// The bytes are not a valid batch until [`seal_crc`] or
    /// [`stamp_producer`] has run on them.
    pub fn build_without_crc(mut self) -> Result<Vec<u8>, BatchError> {
        if self.record_count == 0 {
            return Err(BatchError::Empty);
        }
        let mut out = match self.compression {
            Compression::None => std::mem::take(&mut self.records),
            Compression::Zstd => {
                let compressed =
                    zstd::bulk::compress(&self.records[BATCH_HEADER_BYTES..], self.zstd_level)
                        .map_err(|e| BatchError::Compression(e.to_string()))?;
                let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + compressed.len());
                out.resize(BATCH_HEADER_BYTES, 0);
                out.extend_from_slice(&compressed);
                out
            }
        };
        let batch_length = i32::try_from(out.len() - LOG_OVERHEAD_BYTES)
            .map_err(|_| BatchError::Compression("batch over 2 GiB".into()))?;
        let mut attributes = i16::from(self.compression.code());
        if self.transactional {
            attributes |= ATTRIBUTE_TRANSACTIONAL;
        }
        if self.control {
            attributes |= ATTRIBUTE_CONTROL;
        }
        let mut header = [0u8; BATCH_HEADER_BYTES];
        let fields: [(usize, &[u8]); 12] = [
            (field::BATCH_LENGTH, &batch_length.to_be_bytes()),
            (field::PARTITION_LEADER_EPOCH, &(-1i32).to_be_bytes()),
            (field::MAGIC, &[MAGIC_V2 as u8]),
            (field::ATTRIBUTES, &attributes.to_be_bytes()),
            (
                field::LAST_OFFSET_DELTA,
                &(self.record_count - 1).to_be_bytes(),
            ),
            (field::BASE_TIMESTAMP, &self.base_timestamp_ms.to_be_bytes()),
            (field::MAX_TIMESTAMP, &self.max_timestamp_ms.to_be_bytes()),
            (field::PRODUCER_ID, &self.producer_id.0.to_be_bytes()),
            (field::PRODUCER_EPOCH, &self.producer_epoch.0.to_be_bytes()),
            (field::BASE_SEQUENCE, &self.base_sequence.0.to_be_bytes()),
            (field::RECORD_COUNT, &self.record_count.to_be_bytes()),
            (field::BASE_OFFSET, &0i64.to_be_bytes()),
        ];
        for (at, bytes) in fields {
            header[at..at + bytes.len()].copy_from_slice(bytes);
        }
        out[..BATCH_HEADER_BYTES].copy_from_slice(&header);
        Ok(out)
    }
}

/// Encodes one record whose body (everything after the length) is `body` bytes.
fn put_record(
    out: &mut Vec<u8>,
    body: usize,
    timestamp_delta: i64,
    offset_delta: i32,
    record: &Record<'_>,
) {
    put_varint(out, body as i32);
    out.push(0);
    put_varlong(out, timestamp_delta);
    put_varint(out, offset_delta);
    put_nullable(out, record.key);
    put_nullable(out, record.value);
    put_varint(out, record.headers.len() as i32);
    for h in record.headers {
        put_nullable(out, Some(h.key));
        put_nullable(out, h.value);
    }
}

fn record_body_bytes(record: &Record<'_>, timestamp_delta: i64, offset_delta: i32) -> usize {
    let bytes_len = |b: Option<&[u8]>| match b {
        None => varint_len(-1),
        Some(b) => varint_len(b.len() as i32) + b.len(),
    };
    1 + varlong_len(timestamp_delta)
        + varint_len(offset_delta)
        + bytes_len(record.key)
        + bytes_len(record.value)
        + varint_len(record.headers.len() as i32)
        + record
            .headers
            .iter()
            .map(|h| bytes_len(Some(h.key)) + bytes_len(h.value))
            .sum::<usize>()
}

/// What `retain_records` made of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retained {
    /// Every record was kept: the batch stays byte for byte as it is.
    All,
    /// The batch rewritten with the kept records only (possibly none).
    Rewritten(Vec<u8>),
}

/// Rewrites a stored batch keeping only the records `keep` selects, for
/// compaction. Everything that identifies the batch stays: base offset, leader
/// epoch, attributes (codec, transactional, control), last offset delta (so
/// the batch still spans the same offsets), base and max timestamps, producer
/// id, epoch and base sequence. Kept records keep their offset and timestamp
/// deltas; the record count and CRC are recomputed. A batch that keeps no
/// record is still a valid batch (record count 0) covering its offsets; the
/// caller decides whether to store it.
pub fn retain_records(
    batch: &RecordBatch<'_>,
    decompressed_bytes_max: usize,
    zstd_level: i32,
    mut keep: impl FnMut(&RecordRef<'_>) -> bool,
) -> Result<Retained, BatchError> {
    let header = *batch.header();
    let section = batch.records_section(decompressed_bytes_max)?;
    let mut records = Vec::with_capacity(section.len_bytes());
    let mut kept = 0i32;
    for record in section.iter() {
        let record = record?;
        if !keep(&record) {
            continue;
        }
        let timestamp_delta = record.timestamp_ms.wrapping_sub(header.base_timestamp_ms);
        let offset_delta = i32::try_from(record.offset.0 - header.base_offset.0)
            .expect("a decoded record's offset delta fits i32");
        let as_record = Record {
            timestamp_ms: record.timestamp_ms,
            key: record.key,
            value: record.value,
            headers: &record.headers,
        };
        let body = record_body_bytes(&as_record, timestamp_delta, offset_delta);
        put_record(
            &mut records,
            body,
            timestamp_delta,
            offset_delta,
            &as_record,
        );
        kept += 1;
    }
    if kept == header.record_count {
        return Ok(Retained::All);
    }
    let section_bytes = match header.compression() {
        Compression::None => records,
        Compression::Zstd => zstd::bulk::compress(&records, zstd_level)
            .map_err(|e| BatchError::Compression(e.to_string()))?,
    };
    let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + section_bytes.len());
    out.extend_from_slice(&batch.as_bytes()[..BATCH_HEADER_BYTES]);
    out.extend_from_slice(&section_bytes);
    let batch_length = i32::try_from(out.len() - LOG_OVERHEAD_BYTES)
        .map_err(|_| BatchError::Compression("batch over 2 GiB".into()))?;
    out[field::BATCH_LENGTH..field::BATCH_LENGTH + 4].copy_from_slice(&batch_length.to_be_bytes());
    out[field::RECORD_COUNT..field::RECORD_COUNT + 4].copy_from_slice(&kept.to_be_bytes());
    let crc = compute_crc(&out);
    out[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(Retained::Rewritten(out))
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, i32::try_from(b.len()).expect("field under 2 GiB"));
            out.extend_from_slice(b);
        }
    }
}

pub mod marker;

#[cfg(test)]
mod tests;
