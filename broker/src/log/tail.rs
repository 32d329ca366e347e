//! The unwritten tail of a segment: appended bytes staged in aligned buffers
//! until a direct write carries them to the file. Direct I/O bypasses the page
//! cache, so these buffers are also where reads of not-yet-written bytes go.
//!
//! Chunks are written whole, front to back. Sealing a partly filled chunk
//! copies its last partial page into a chunk of its own, one page long, so the
//! next write rewrites that page with the same prefix and more data; writes
//! stay aligned and no byte is ever written out of order.
//!
//! That page is a chunk of its own because it is already on disk and the
//! pages after it are not: a write covering both is neither a pure overwrite
//! nor a pure write into allocated space, and ext4 completes such a direct
//! write only on a kernel worker thread, where each of the two kinds alone
//! completes inline (the log allocates a segment's space ahead of its
//! writes, `PartitionLog::preallocate_for`).
//!
//! A chunk is sized by what its log appends between writes, up to
//! `chunk_bytes`: a group commit seals the open chunk each round, and a
//! broker of thousands of partitions that each append a record or two per
//! round would otherwise take a fresh `chunk_bytes` buffer per record, past
//! the shard's I/O memory and onto the heap (a page fault per touched page
//! and an unmap per chunk).

use std::collections::VecDeque;

use crate::runtime::{AlignedBuffer, SharedBuffer, DIRECT_IO_ALIGNMENT_BYTES};

const ALIGN: u64 = DIRECT_IO_ALIGNMENT_BYTES;

fn align_down(v: u64) -> u64 {
    v - v % ALIGN
}

fn align_up(v: u64) -> u64 {
    align_down(v + ALIGN - 1)
}

/// The smallest open chunk: a carried partial page and a page more.
const OPEN_CHUNK_BYTES_MIN: usize = 2 * ALIGN as usize;

/// A chunk frozen for writing: covers file bytes [start, start + len).
#[derive(Clone, Debug)]
pub struct SealedChunk {
    pub start: u64,
    pub len: usize,
    pub buffer: SharedBuffer,
}

#[derive(Debug)]
pub struct Tail {
    /// The largest chunk, and so the largest single write.
    chunk_bytes: usize,
    open: AlignedBuffer,
    /// Size of `open`: aligned, at most `chunk_bytes`.
    open_capacity: usize,
    /// File position of `open[0]`, aligned.
    open_start: u64,
    /// Bytes of `open` holding data.
    open_len: usize,
    /// Leading bytes of `open` already sealed (the copied partial page).
    open_sealed_len: usize,
    /// While `open` is a carried page alone: the size of the chunk to open
    /// once that page fills.
    planned_capacity: Option<usize>,
    sealed: VecDeque<SealedChunk>,
}

impl Tail {
    /// A tail for a segment whose file holds `file_bytes` valid bytes; the last
    /// partial page of those (`partial_page`) must be passed in, since the next
    /// write rewrites it.
    pub fn new(chunk_bytes: usize, file_bytes: u64, partial_page: &[u8]) -> Tail {
        let open_start = align_down(file_bytes);
        assert_eq!(partial_page.len() as u64, file_bytes - open_start);
        assert!(chunk_bytes as u64 >= ALIGN && (chunk_bytes as u64).is_multiple_of(ALIGN));
        let first_capacity = chunk_bytes.min(OPEN_CHUNK_BYTES_MIN);
        let (open_capacity, planned_capacity) = if partial_page.is_empty() {
            (first_capacity, None)
        } else {
            (ALIGN as usize, Some(first_capacity))
        };
        let mut open = AlignedBuffer::new(open_capacity);
        open.as_mut_slice()[..partial_page.len()].copy_from_slice(partial_page);
        Tail {
            chunk_bytes,
            open,
            open_capacity,
            open_start,
            open_len: partial_page.len(),
            open_sealed_len: partial_page.len(),
            planned_capacity,
            sealed: VecDeque::new(),
        }
    }

    /// End of the appended bytes.
    pub fn end(&self) -> u64 {
        self.open_start + self.open_len as u64
    }

    /// Lowest file position served from memory; everything below is on disk.
    pub fn floor(&self) -> u64 {
        self.sealed.front().map_or(self.open_start, |c| c.start)
    }

    /// Bytes appended but not yet written to the file.
    pub fn unwritten_bytes(&self) -> usize {
        self.sealed.iter().map(|c| c.len).sum::<usize>() + (self.open_len - self.open_sealed_len)
    }

    pub fn has_unsealed(&self) -> bool {
        self.open_len > self.open_sealed_len
    }

    pub fn append(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = self.open_capacity - self.open_len;
            let take = room.min(bytes.len());
            self.open.as_mut_slice()[self.open_len..self.open_len + take]
                .copy_from_slice(&bytes[..take]);
            self.open_len += take;
            bytes = &bytes[take..];
            if self.open_len == self.open_capacity {
                self.seal_full();
            }
        }
    }

    /// A filled chunk: the log appends faster than it writes, so the next
    /// one is twice the size, up to `chunk_bytes`; after a filled carried
    /// page, the size planned when it was carried.
    fn seal_full(&mut self) {
        let full_len = self.open_capacity;
        self.open_capacity = self
            .planned_capacity
            .take()
            .unwrap_or((full_len * 2).min(self.chunk_bytes));
        let next = AlignedBuffer::new(self.open_capacity);
        let full = std::mem::replace(&mut self.open, next);
        self.sealed.push_back(SealedChunk {
            start: self.open_start,
            len: full_len,
            buffer: full.seal(full_len),
        });
        self.open_start += full_len as u64;
        self.open_len = 0;
        self.open_sealed_len = 0;
    }

    /// Seals whatever the open chunk holds so a write can carry it now.
    pub fn seal_partial(&mut self) {
        if !self.has_unsealed() {
            return;
        }
        let end = self.end();
        let carry_from = (align_down(end) - self.open_start) as usize;
        let carry = self.open_len - carry_from;
        // Room for the carried page and four times what this chunk took
        // since it opened, in a power of two (the I/O memory is a buddy
        // allocator). A log that takes more than a sixteenth of the largest
        // chunk per write gets the largest: a round that outgrows its chunk
        // costs a second write, and busy logs are few.
        let wanted = carry + 4 * (self.open_len - self.open_sealed_len);
        let capacity = if wanted >= self.chunk_bytes / 4 {
            self.chunk_bytes
        } else {
            wanted
                .next_power_of_two()
                .max(OPEN_CHUNK_BYTES_MIN)
                .min(self.chunk_bytes)
        };
        if carry == 0 {
            self.open_capacity = capacity;
            self.planned_capacity = None;
        } else {
            self.open_capacity = ALIGN as usize;
            self.planned_capacity = Some(capacity);
        }
        let mut next = AlignedBuffer::new(self.open_capacity);
        next.as_mut_slice()[..carry].copy_from_slice(&self.open[carry_from..self.open_len]);
        let mut current = std::mem::replace(&mut self.open, next);
        let write_len = align_up(self.open_len as u64) as usize;
        current.as_mut_slice()[self.open_len..write_len].fill(0);
        self.sealed.push_back(SealedChunk {
            start: self.open_start,
            len: self.open_len,
            buffer: current.seal(write_len),
        });
        self.open_start = align_down(end);
        self.open_len -= carry_from;
        self.open_sealed_len = self.open_len;
        debug_assert_eq!(self.end(), end);
    }

    /// The oldest chunk awaiting its write.
    pub fn front_sealed(&self) -> Option<SealedChunk> {
        self.sealed.front().cloned()
    }

    /// The oldest sealed chunks below `end` that may be written concurrently: up
    /// to `count_max` of them, ending at the first one whose end is not aligned,
    /// since the chunk after it rewrites that last page and must land later.
    pub fn write_wave(&self, end: u64, count_max: usize) -> Vec<SealedChunk> {
        let mut wave = Vec::new();
        for chunk in self
            .sealed
            .iter()
            .take_while(|c| c.start < end)
            .take(count_max)
        {
            wave.push(chunk.clone());
            if !(chunk.start + chunk.len as u64).is_multiple_of(ALIGN) {
                break;
            }
        }
        wave
    }

    /// Records that the oldest sealed chunk reached the file.
    pub fn pop_written(&mut self, start: u64) {
        let chunk = self.sealed.pop_front().expect("a chunk was being written");
        assert_eq!(chunk.start, start, "chunks are written in order");
    }

    /// Copies file bytes [position, position + out.len()) from memory; the range
    /// must lie within [floor, end).
    pub fn read(&self, position: u64, out: &mut [u8]) {
        assert!(position >= self.floor() && position + out.len() as u64 <= self.end());
        let mut done = 0;
        while done < out.len() {
            let at = position + done as u64;
            let (start, len, bytes): (u64, usize, &[u8]) = if at >= self.open_start {
                (self.open_start, self.open_len, &self.open)
            } else {
                let chunk = self
                    .sealed
                    .iter()
                    .rev()
                    .find(|c| c.start <= at && at < c.start + c.len as u64)
                    .expect("tail covers the range");
                (chunk.start, chunk.len, &chunk.buffer)
            };
            let from = (at - start) as usize;
            let take = (len - from).min(out.len() - done);
            out[done..done + take].copy_from_slice(&bytes[from..from + take]);
            done += take;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Writes every sealed chunk (all of them, in order) into `file`, as the
    /// log's write-out does, and checks each write is aligned.
    ///
    /// Also checks that a write covers pages already written or pages never
    /// written, never both (`file` holds exactly the pages written so far).
    fn write_all(tail: &mut Tail, file: &mut Vec<u8>) -> Vec<usize> {
        let mut sizes = Vec::new();
        while let Some(chunk) = tail.front_sealed() {
            assert_eq!(chunk.start % ALIGN, 0, "writes start on a page");
            assert_eq!(chunk.buffer.len() as u64 % ALIGN, 0, "writes end on a page");
            let start = chunk.start as usize;
            let end = start + chunk.buffer.len();
            assert!(
                end <= file.len() || start >= file.len(),
                "a write of [{start}, {end}) covers written pages and new ones (file ends at {})",
                file.len()
            );
            if file.len() < end {
                file.resize(end, 0);
            }
            file[start..end].copy_from_slice(&chunk.buffer);
            sizes.push(chunk.buffer.len());
            tail.pop_written(chunk.start);
        }
        sizes
    }

    #[test]
    fn a_log_appending_little_between_writes_takes_small_chunks() {
        crate::runtime::run_local(async {
            let chunk_bytes = 1 << 20;
            let mut tail = Tail::new(chunk_bytes, 0, &[]);
            let mut file = Vec::new();
            let mut written = Vec::new();
            for i in 0..100u8 {
                let record = vec![i; 600];
                tail.append(&record);
                written.extend_from_slice(&record);
                tail.seal_partial();
                for size in write_all(&mut tail, &mut file) {
                    assert!(size <= OPEN_CHUNK_BYTES_MIN, "a write of {size} bytes");
                }
                assert!(tail.open_capacity <= OPEN_CHUNK_BYTES_MIN);
            }
            assert_eq!(&file[..written.len()], &written[..]);
        });
    }

    #[test]
    fn a_log_appending_fast_grows_its_chunks_to_the_largest() {
        crate::runtime::run_local(async {
            let chunk_bytes = 256 << 10;
            let mut tail = Tail::new(chunk_bytes, 0, &[]);
            let mut file = Vec::new();
            let mut written = Vec::new();
            for i in 0..64u8 {
                let batch = vec![i; 64 << 10];
                tail.append(&batch);
                written.extend_from_slice(&batch);
            }
            let sizes = write_all(&mut tail, &mut file);
            assert_eq!(sizes[0], OPEN_CHUNK_BYTES_MIN);
            assert!(sizes
                .windows(2)
                .all(|w| w[1] == (w[0] * 2).min(chunk_bytes)));
            assert_eq!(*sizes.last().expect("chunks"), chunk_bytes);
            // After a burst, a partial seal sizes the next chunk by the burst.
            tail.append(&[7; 100 << 10]);
            written.extend_from_slice(&[7; 100 << 10]);
            tail.seal_partial();
            assert_eq!(tail.open_capacity, chunk_bytes);
            write_all(&mut tail, &mut file);
            assert_eq!(&file[..written.len()], &written[..]);
        });
    }

    #[derive(Clone, Debug)]
    enum Step {
        Append(usize),
        Seal,
        Write,
        Read(usize, usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (1usize..20_000).prop_map(Step::Append),
            2 => Just(Step::Seal),
            2 => Just(Step::Write),
            1 => (any::<usize>(), 1usize..10_000).prop_map(|(at, len)| Step::Read(at, len)),
        ]
    }

    proptest! {
        /// Whatever the chunk sizes, the file (written chunk by chunk, in
        /// order, rewriting carried pages) holds exactly the appended bytes,
        /// and reads of what is still in memory return them too.
        #[test]
        fn written_and_staged_bytes_are_the_appended_bytes(
            chunk_pages in 1usize..40,
            existing in 0usize..10_000,
            steps in proptest::collection::vec(step(), 1..60),
        ) {
            crate::runtime::run_local(async move {
                let chunk_bytes = chunk_pages * ALIGN as usize;
                let model: Vec<u8> = (0..existing).map(|i| (i % 251) as u8).collect();
                let partial = align_down(existing as u64) as usize;
                // As on disk: the last partial page is a whole written page.
                let mut file = model.clone();
                file.resize(align_up(existing as u64) as usize, 0);
                let mut model = model;
                let mut tail = Tail::new(chunk_bytes, existing as u64, &model[partial..]);
                let mut counter = 0u8;
                for step in steps {
                    match step {
                        Step::Append(len) => {
                            let bytes: Vec<u8> = (0..len)
                                .map(|_| {
                                    counter = counter.wrapping_add(1);
                                    counter
                                })
                                .collect();
                            tail.append(&bytes);
                            model.extend_from_slice(&bytes);
                        }
                        Step::Seal => tail.seal_partial(),
                        Step::Write => {
                            for size in write_all(&mut tail, &mut file) {
                                assert!(size <= chunk_bytes);
                            }
                        }
                        Step::Read(at, len) => {
                            let floor = tail.floor() as usize;
                            let span = model.len() - floor;
                            if span > 0 {
                                let at = floor + at % span;
                                let len = len.min(model.len() - at);
                                let mut out = vec![0; len];
                                tail.read(at as u64, &mut out);
                                assert_eq!(&out[..], &model[at..at + len]);
                            }
                        }
                    }
                    assert!(tail.open_capacity <= chunk_bytes.max(ALIGN as usize));
                    assert_eq!(tail.end(), model.len() as u64);
                }
                tail.seal_partial();
                write_all(&mut tail, &mut file);
                assert_eq!(tail.unwritten_bytes(), 0);
                assert_eq!(&file[..model.len()], &model[..]);
                assert!(file[model.len()..].iter().all(|&b| b == 0), "padding is zeros");
            });
        }
    }
}
