//! What names a partition replica inside a broker, and the form its stored
//! bytes travel in between the batch cache, the log and the socket. Every
//! layer above the log uses these; they depend on nothing of the broker.

use bytes::Bytes;

/// A partition as the broker names it internally.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    pub topic: String,
    pub partition: i32,
}

#[derive(Clone, Debug, Default)]
pub struct Chunks {
    parts: Vec<Bytes>,
    len: usize,
}

impl Chunks {
    pub fn push(&mut self, part: Bytes) {
        self.len += part.len();
        self.parts.push(part);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.parts.clear();
        self.len = 0;
    }

    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }
}

impl From<Vec<u8>> for Chunks {
    fn from(bytes: Vec<u8>) -> Chunks {
        let mut chunks = Chunks::default();
        if !bytes.is_empty() {
            chunks.push(Bytes::from(bytes));
        }
        chunks
    }
}
