//! The unwritten tail of a segment: appended bytes staged in aligned buffers
//! until a direct write carries them to the file. Direct I/O bypasses the page
//! cache, so these buffers are also where reads of not-yet-written bytes go.
//!
//! Chunks are written whole, front to back. Sealing a partly filled chunk
//! copies its last partial page into the next chunk, so the next write rewrites
//! that page with the same prefix and more data; writes stay aligned and no
//! byte is ever written out of order.

use std::collections::VecDeque;

use crate::runtime::{AlignedBuffer, SharedBuffer, DIRECT_IO_ALIGNMENT_BYTES};

const ALIGN: u64 = DIRECT_IO_ALIGNMENT_BYTES;

fn align_down(v: u64) -> u64 {
    v - v % ALIGN
}

fn align_up(v: u64) -> u64 {
    align_down(v + ALIGN - 1)
}

/// A chunk frozen for writing: covers file bytes [start, start + len).
#[derive(Clone, Debug)]
pub struct SealedChunk {
    pub start: u64,
    pub len: usize,
    pub buffer: SharedBuffer,
}

#[derive(Debug)]
pub struct Tail {
    chunk_bytes: usize,
    open: AlignedBuffer,
    /// File position of `open[0]`, aligned.
    open_start: u64,
    /// Bytes of `open` holding data.
    open_len: usize,
    /// Leading bytes of `open` already sealed (the copied partial page).
    open_sealed_len: usize,
    sealed: VecDeque<SealedChunk>,
}

impl Tail {
    /// A tail for a segment whose file holds `file_bytes` valid bytes; the last
    /// partial page of those (`partial_page`) must be passed in, since the next
    /// write rewrites it.
    pub fn new(chunk_bytes: usize, file_bytes: u64, partial_page: &[u8]) -> Tail {
        let open_start = align_down(file_bytes);
        assert_eq!(partial_page.len() as u64, file_bytes - open_start);
        let mut open = AlignedBuffer::new(chunk_bytes);
        open.as_mut_slice()[..partial_page.len()].copy_from_slice(partial_page);
        Tail {
            chunk_bytes,
            open,
            open_start,
            open_len: partial_page.len(),
            open_sealed_len: partial_page.len(),
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
            let room = self.chunk_bytes - self.open_len;
            let take = room.min(bytes.len());
            self.open.as_mut_slice()[self.open_len..self.open_len + take]
                .copy_from_slice(&bytes[..take]);
            self.open_len += take;
            bytes = &bytes[take..];
            if self.open_len == self.chunk_bytes {
                self.seal_full();
            }
        }
    }

    fn seal_full(&mut self) {
        let next = AlignedBuffer::new(self.chunk_bytes);
        let full = std::mem::replace(&mut self.open, next);
        self.sealed.push_back(SealedChunk {
            start: self.open_start,
            len: self.chunk_bytes,
            buffer: full.seal(self.chunk_bytes),
        });
        self.open_start += self.chunk_bytes as u64;
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
        let mut next = AlignedBuffer::new(self.chunk_bytes);
        next.as_mut_slice()[..self.open_len - carry_from]
            .copy_from_slice(&self.open[carry_from..self.open_len]);
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
